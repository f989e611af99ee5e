package pprof

import (
	"encoding/binary"
	"hash/maphash"
	"io"
	"iter"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/google/pprof/profile"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// profile.proto field numbers.
const (
	profSampleType    = 1
	profSample        = 2
	profMapping       = 3
	profLocation      = 4
	profFunction      = 5
	profStringTable   = 6
	profTimeNanos     = 9
	profDurationNanos = 10
	profPeriodType    = 11
	profPeriod        = 12
	profComment       = 13
	profDefaultType   = 14

	sampleLocationID = 1
	sampleValue      = 2
	sampleLabel      = 3

	labelKey = 1
	labelStr = 2
	labelNum = 3

	valueTypeType = 1
	valueTypeUnit = 2

	mappingID           = 1
	mappingFilename     = 5
	mappingHasFunctions = 7

	locationID        = 1
	locationMappingID = 2
	locationAddress   = 3
	locationLine      = 4

	lineFunctionID = 1
	lineLine       = 2

	functionID         = 1
	functionName       = 2
	functionSystemName = 3
	functionFilename   = 4
)

// Encoder writes pprof profiles of profiler rows in pprof's protobuf
// (profile.proto): one profile (record, an out-of-memory snapshot), or
// one every interval (a Pyroscope series). Most of a profile does not
// change between two intervals: the functions, locations and each row's
// list of locations, and the labels. An Encoder keeps them encoded, and a
// profile encodes only the values; no Profile of every sample is built.
// pprof's own reader reads the result (encode_test).
type Encoder struct {
	intervals bool
	column    map[memory.View]int // where a view's values start
	// picks, when set, are the Values each sample type takes, for a
	// profile of other sample types than the views' (NewMallocEncoder).
	picks       []int
	noPeriod    bool // no period type: Pyroscope's profile type ends in "::"
	types       []*profile.ValueType
	defaultType string
	strings     map[string]uint64
	stringList  []string
	tables      []byte // mappings, locations and functions, encoded
	mappings    map[string]uint64
	functions   map[[2]string]uint64
	locations   map[locationKey]uint64
	rows        map[accounting.Key]*rowSample
	labels      map[labelsKey]*labels
	profile     uint64 // profiles written

	// The profile being written.
	samples []byte // encoded
	n       int    // samples in it
	raw     []byte // what follows the samples
}

// rowSample is one row's sample: its location IDs, encoded, and what it
// had allocated at the previous profile.
type rowSample struct {
	locations []byte // packed location IDs
	frames    uint64 // hash of the frames they were made from
	prev      accounting.Amount
	profile   uint64 // the last profile with the row
}

// labels are the encoded labels of the samples of one process, kind and
// device, made again when one of what they were made from changed.
type labels struct {
	comm      string
	container container.Identity
	device    gpuinfo.Device
	encoded   []byte
}

type labelsKey struct {
	pid    uint32
	kind   memory.Kind
	device int32
}

type locationKey struct {
	module, function, file string
	address                uint64
	line                   int64
}

// NewEncoder makes an encoder of profiles with the sample types of views,
// in order, the first view's inuse_space the default. With intervals, a
// profile's allocations are those since the previous profile (a series
// pushed every interval); else since tracing began.
func NewEncoder(intervals bool, views ...memory.View) *Encoder {
	e := newEncoder(intervals)
	for _, v := range views {
		e.column[v] = len(e.types)
		e.types = append(e.types, SampleTypes(v)...)
	}
	e.defaultType = DefaultSampleType(views[0])
	return e
}

// Malloc is the sample type of the profiles Inspektor Gadget's profile_cuda
// gadget pushes to Pyroscope (process_cpu:malloc:bytes::), which its GPU
// observability dashboard's flame graph reads.
var Malloc = &profile.ValueType{Type: "malloc", Unit: "bytes"}

// NewMallocEncoder makes an encoder of profiles of one sample type, Malloc,
// without a period type: the driver view's bytes allocated since the
// previous profile, each interval's.
func NewMallocEncoder() *Encoder {
	e := newEncoder(true)
	e.column[memory.ViewDriver] = 0
	e.types, e.picks, e.noPeriod = []*profile.ValueType{Malloc}, []int{AllocSpace}, true
	e.defaultType = Malloc.Type
	return e
}

func newEncoder(intervals bool) *Encoder {
	e := &Encoder{
		intervals: intervals,
		column:    map[memory.View]int{},
		strings:   map[string]uint64{},
		mappings:  map[string]uint64{},
		functions: map[[2]string]uint64{},
		locations: map[locationKey]uint64{},
		rows:      map[accounting.Key]*rowSample{},
		labels:    map[labelsKey]*labels{},
		profile:   1,
	}
	e.str("")
	return e
}

func (e *Encoder) str(v string) uint64 {
	i, ok := e.strings[v]
	if !ok {
		i = uint64(len(e.stringList))
		e.strings[v] = i
		// Pyroscope refuses a profile with a string that is not UTF-8
		// (ValidateProfile): a process may name itself or its functions
		// with any bytes.
		e.stringList = append(e.stringList, strings.ToValidUTF8(v, "\uFFFD"))
	}
	return i
}

func (e *Encoder) mapping(module string) uint64 {
	id, ok := e.mappings[module]
	if !ok {
		id = uint64(len(e.mappings) + 1)
		e.mappings[module] = id
		var m []byte
		m = varintField(m, mappingID, id)
		m = varintField(m, mappingFilename, e.str(module))
		m = varintField(m, mappingHasFunctions, 1)
		e.tables = bytesField(e.tables, profMapping, m)
	}
	return id
}

func (e *Encoder) function(name, file string) uint64 {
	key := [2]string{name, file}
	id, ok := e.functions[key]
	if !ok {
		id = uint64(len(e.functions) + 1)
		e.functions[key] = id
		var f []byte
		f = varintField(f, functionID, id)
		f = varintField(f, functionName, e.str(name))
		f = varintField(f, functionSystemName, e.str(name))
		f = varintField(f, functionFilename, e.str(file))
		e.tables = bytesField(e.tables, profFunction, f)
	}
	return id
}

// location is a frame's location: its address in its module, and one line,
// its function's (for Python frames, the source line).
func (e *Encoder) location(f *symbolize.Frame) uint64 {
	key := locationKey{f.Module, f.Name(), f.File, f.Address, f.Line}
	id, ok := e.locations[key]
	if !ok {
		id = uint64(len(e.locations) + 1)
		e.locations[key] = id
		file := f.File // Python frames name their source file
		if file == "" {
			file = filepath.Base(f.Module)
		}
		var line []byte
		line = varintField(line, lineFunctionID, e.function(key.function, file))
		if f.Line != 0 {
			line = varintField(line, lineLine, uint64(f.Line))
		}
		var l []byte
		l = varintField(l, locationID, id)
		l = varintField(l, locationMappingID, e.mapping(f.Module))
		if f.Address != 0 {
			l = varintField(l, locationAddress, f.Address)
		}
		l = bytesField(l, locationLine, line)
		e.tables = bytesField(e.tables, profLocation, l)
	}
	return id
}

var framesSeed = maphash.MakeSeed()

// framesHash tells whether a row's frames are those its sample was made
// from: the same frames are the same pointers, from the profiler's frame
// table (rows from elsewhere are made again each interval).
func framesHash(frames []*symbolize.Frame) uint64 {
	return maphash.Bytes(framesSeed, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(frames))), len(frames)*int(unsafe.Sizeof(frames[0]))))
}

// sample returns the row's sample, made or made again if its frames
// changed (named since the last profile).
func (e *Encoder) sample(row *snapshot.Row) *rowSample {
	h := framesHash(row.Frames)
	rs := e.rows[row.Key]
	if rs == nil {
		rs = &rowSample{prev: row.Before} // what a previous agent pushed
		e.rows[row.Key] = rs
	} else if rs.frames == h && rs.locations != nil {
		return rs
	}
	rs.frames = h
	rs.locations = rs.locations[:0]
	for _, f := range row.Frames {
		rs.locations = protowire.AppendVarint(rs.locations, e.location(f))
	}
	return rs
}

// sampleLabels returns the encoded labels of a row's sample.
func (e *Encoder) sampleLabels(row *snapshot.Row) []byte {
	k := labelsKey{row.PID, row.Kind, row.Key.Device}
	l := e.labels[k]
	if l != nil && l.comm == row.Comm && l.container == row.Container && l.device == row.Device {
		return l.encoded
	}
	if l == nil {
		l = &labels{}
		e.labels[k] = l
	}
	l.comm, l.container, l.device = row.Comm, row.Container, row.Device
	l.encoded = l.encoded[:0]
	for name, value := range rowLabels(row) {
		var b []byte
		b = varintField(b, labelKey, e.str(name))
		b = varintField(b, labelStr, e.str(value))
		l.encoded = bytesField(l.encoded, sampleLabel, b)
	}
	var b []byte
	b = varintField(b, labelKey, e.str(schema.PID))
	b = varintField(b, labelNum, uint64(row.PID))
	l.encoded = bytesField(l.encoded, sampleLabel, b)
	return l.encoded
}

// rowLabels are a row's string labels, those it has; its pid is a number.
func rowLabels(row *snapshot.Row) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		c := row.Container
		for _, l := range [...][2]string{
			{schema.Comm, row.Comm}, {schema.Kind, row.Kind.String()}, {schema.GPU, row.GPU()},
			{schema.PodUID, c.PodUID}, {schema.ContainerID, c.ContainerID},
			{schema.Namespace, c.Namespace}, {schema.Pod, c.Pod}, {schema.Container, c.Name},
			{schema.GPUUUID, row.Device.UUID}, {schema.GPUName, row.Device.Name},
		} {
			if l[1] != "" && !yield(l[0], l[1]) {
				return
			}
		}
	}
}

// Add adds a row's sample to the profile being written, unless its values
// are all zero or its view is not one of the encoder's: what it allocated
// (since the previous profile, with intervals), what it holds, and peak,
// its share of its process's peak on its GPU in its view (PeakShares).
func (e *Encoder) Add(row *snapshot.Row, peak accounting.Amount) {
	at, ok := e.column[row.Kind.View()]
	if !ok {
		return
	}
	rs := e.sample(row)
	rs.profile = e.profile
	allocated := accounting.Amount{Bytes: row.AllocBytes, Count: row.AllocCount}
	v := NewValues(accounting.Amount{Bytes: allocated.Bytes - rs.prev.Bytes, Count: allocated.Count - rs.prev.Count},
		accounting.Amount{Bytes: row.LiveBytes(), Count: row.LiveCount()}, peak)
	if e.intervals {
		rs.prev = allocated
	}
	if e.picks != nil {
		v = e.picked(v)
	}
	if v == (Values{}) {
		return
	}
	var buf [2 * len(v) * binary.MaxVarintLen64]byte // both views
	packed := buf[:0]
	for i := range e.types {
		x := int64(0)
		if i >= at && i < at+len(v) {
			x = v[i-at]
		}
		packed = protowire.AppendVarint(packed, uint64(x))
	}
	e.write(row, rs, packed)
}

// write writes a sample of row, its values packed.
func (e *Encoder) write(row *snapshot.Row, rs *rowSample, packed []byte) {
	e.n++
	labels := e.sampleLabels(row)
	size := protowire.SizeTag(sampleLocationID) + protowire.SizeBytes(len(rs.locations)) +
		protowire.SizeTag(sampleValue) + protowire.SizeBytes(len(packed)) + len(labels)
	b := protowire.AppendTag(e.samples, profSample, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = bytesField(b, sampleLocationID, rs.locations)
	b = bytesField(b, sampleValue, packed)
	e.samples = append(b, labels...)
}

// GrowthSampleType is the sample type of view v's growth profiles: the
// bytes each growing stack's low-water mark rose over the detection window
// (snapshot.Growing.Grew), growth_space (tensor_growth_space).
func GrowthSampleType(v memory.View) *profile.ValueType {
	if v == memory.ViewTensor {
		return &profile.ValueType{Type: "tensor_growth_space", Unit: "bytes"}
	}
	return &profile.ValueType{Type: "growth_space", Unit: "bytes"}
}

// NewGrowthEncoder makes an encoder of view v's growth profiles, of one
// sample type (GrowthSampleType), added with AddGrowth.
func NewGrowthEncoder(v memory.View) *Encoder {
	e := newEncoder(false)
	e.column[v] = 0
	e.types = []*profile.ValueType{GrowthSampleType(v)}
	e.defaultType = e.types[0].Type
	return e
}

// AddGrowth adds a growing row's sample to a growth profile: the bytes it
// grew over the detection window.
func (e *Encoder) AddGrowth(g *snapshot.Growing) {
	row := &snapshot.Row{Key: g.Key, Comm: g.Comm, Device: g.Device, Container: g.Container, Frames: g.Frames}
	rs := e.sample(row)
	rs.profile = e.profile
	e.write(row, rs, protowire.AppendVarint(nil, g.Grew))
}

// picked are the values of the encoder's sample types, in order, from v.
func (e *Encoder) picked(v Values) Values {
	var out Values
	for i, at := range e.picks {
		out[i] = v[at]
	}
	return out
}

// Len is the number of samples in the profile being written.
func (e *Encoder) Len() int { return e.n }

// WriteTo writes the profile of the samples added since the previous one,
// taken at t over duration, with comments, and starts the next.
func (e *Encoder) WriteTo(w io.Writer, t time.Time, duration time.Duration, comments ...string) error {
	// The samples are written as they are; then the rest.
	raw := e.raw[:0]
	for _, st := range e.types {
		raw = appendValueType(raw, profSampleType, e.str(st.Type), e.str(st.Unit))
	}
	raw = append(raw, e.tables...)
	raw = varintField(raw, profTimeNanos, uint64(t.UnixNano()))
	raw = varintField(raw, profDurationNanos, uint64(duration.Nanoseconds()))
	if !e.noPeriod {
		raw = appendValueType(raw, profPeriodType, e.str(PeriodType), e.str(PeriodUnit))
		raw = varintField(raw, profPeriod, 1)
	}
	for _, c := range comments {
		raw = varintField(raw, profComment, e.str(c))
	}
	raw = varintField(raw, profDefaultType, e.str(e.defaultType))
	for _, v := range e.stringList {
		raw = protowire.AppendString(protowire.AppendTag(raw, profStringTable, protowire.BytesType), v)
	}
	e.raw = raw // for the next profile
	_, err := w.Write(e.samples)
	if err == nil {
		_, err = w.Write(raw)
	}
	e.Discard()
	return err
}

// Discard drops the profile being written and starts the next. Rows not
// added to it are forgotten.
func (e *Encoder) Discard() {
	for key, rs := range e.rows {
		if rs.profile != e.profile {
			delete(e.rows, key) // no longer reported: its process was dropped
		}
	}
	e.profile++
	e.samples, e.n = e.samples[:0], 0
}

func appendValueType(b []byte, field protowire.Number, typ, unit uint64) []byte {
	var v []byte
	v = varintField(v, valueTypeType, typ)
	v = varintField(v, valueTypeUnit, unit)
	return bytesField(b, field, v)
}

// varintField appends field n of value v.
func varintField(b []byte, n protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, n, protowire.VarintType), v)
}

// bytesField appends field n holding v (a string or an embedded message).
func bytesField(b []byte, n protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, n, protowire.BytesType), v)
}
