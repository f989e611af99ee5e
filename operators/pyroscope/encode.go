package pyroscope

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"hash/maphash"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/google/pprof/profile"
	typesv1 "github.com/grafana/pyroscope/api/gen/proto/go/types/v1"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// A series' profile is pushed every interval, and most of it does not
// change between two: the functions, locations and each stack's list of
// locations. So each series keeps its profile's tables and each row's
// sample encoded, in pprof's protobuf (profile.proto), and an interval
// encodes only the values; what the pprof package would build anew, a
// Profile of every sample with its labels, is not built at all. pprof's
// own reader reads the result (exporter_test).

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

// seriesProfile is what a series keeps between intervals.
type seriesProfile struct {
	// types are the sample types of the series' view (pprof.SampleTypes):
	// a series is one kind of memory, so one view, and a tensor series'
	// types are the tensor view's own, which Pyroscope keeps apart as
	// profile types of their own (memory:tensor_inuse_space:...).
	types       []*profile.ValueType
	defaultType string
	strings     map[string]uint64
	stringList  []string
	tables      []byte // mappings, locations and functions, encoded
	mappings    map[string]uint64
	functions   map[[2]string]uint64
	locations   map[locationKey]uint64
	rows        map[accounting.Key]*rowSample
	seen        uint64 // the last interval with rows

	// The interval being written.
	labels     []byte // of every sample
	samples    []byte // encoded
	n          int    // samples in it
	pushLabels []*typesv1.LabelPair
}

// rowSample is one row's sample: its location IDs, encoded, and the
// counters pushed last.
type rowSample struct {
	locations                      []byte // packed location IDs
	frames                         uint64 // hash of the frames they were made from
	prevAllocCount, prevAllocBytes uint64
	seen                           uint64
}

type locationKey struct {
	module, function, file string
	address                uint64
	line                   int64
}

func newSeriesProfile(view tracer.View) *seriesProfile {
	s := &seriesProfile{
		types:       pprof.SampleTypes(view),
		defaultType: pprof.DefaultSampleType(view),
		strings:     map[string]uint64{},
		mappings:    map[string]uint64{},
		functions:   map[[2]string]uint64{},
		locations:   map[locationKey]uint64{},
		rows:        map[accounting.Key]*rowSample{},
	}
	s.str("")
	for _, t := range s.types {
		s.str(t.Type)
		s.str(t.Unit)
	}
	s.str("space")
	return s
}

func (s *seriesProfile) str(v string) uint64 {
	i, ok := s.strings[v]
	if !ok {
		i = uint64(len(s.stringList))
		s.strings[v] = i
		// Pyroscope refuses a profile with a string that is not UTF-8
		// (ValidateProfile): a process may name itself or its functions
		// with any bytes.
		s.stringList = append(s.stringList, strings.ToValidUTF8(v, "\uFFFD"))
	}
	return i
}

func (s *seriesProfile) mapping(module string) uint64 {
	id, ok := s.mappings[module]
	if !ok {
		id = uint64(len(s.mappings) + 1)
		s.mappings[module] = id
		var m []byte
		m = varintField(m, mappingID, id)
		m = varintField(m, mappingFilename, s.str(module))
		m = varintField(m, mappingHasFunctions, 1)
		s.tables = bytesField(s.tables, profMapping, m)
	}
	return id
}

func (s *seriesProfile) function(name, file string) uint64 {
	key := [2]string{name, file}
	id, ok := s.functions[key]
	if !ok {
		id = uint64(len(s.functions) + 1)
		s.functions[key] = id
		var f []byte
		f = varintField(f, functionID, id)
		f = varintField(f, functionName, s.str(name))
		f = varintField(f, functionSystemName, s.str(name))
		f = varintField(f, functionFilename, s.str(file))
		s.tables = bytesField(s.tables, profFunction, f)
	}
	return id
}

// location is a frame's location: its address in its module, and one line,
// its function's (for Python frames, the source line).
func (s *seriesProfile) location(f *symbolize.Frame) uint64 {
	key := locationKey{f.Module, f.Name(), f.File, f.Address, f.Line}
	id, ok := s.locations[key]
	if !ok {
		id = uint64(len(s.locations) + 1)
		s.locations[key] = id
		file := f.File // Python frames name their source file
		if file == "" {
			file = filepath.Base(f.Module)
		}
		var line []byte
		line = varintField(line, lineFunctionID, s.function(key.function, file))
		if f.Line != 0 {
			line = varintField(line, lineLine, uint64(f.Line))
		}
		var l []byte
		l = varintField(l, locationID, id)
		l = varintField(l, locationMappingID, s.mapping(f.Module))
		if f.Address != 0 {
			l = varintField(l, locationAddress, f.Address)
		}
		l = bytesField(l, locationLine, line)
		s.tables = bytesField(s.tables, profLocation, l)
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
// changed (named since the last interval).
func (s *seriesProfile) sample(row *profiler.Row) *rowSample {
	h := framesHash(row.Frames)
	rs := s.rows[row.Key]
	if rs == nil {
		rs = &rowSample{}
		s.rows[row.Key] = rs
	} else if rs.frames == h && rs.locations != nil {
		return rs
	}
	rs.frames = h
	rs.locations = rs.locations[:0]
	for _, f := range row.Frames {
		rs.locations = protowire.AppendVarint(rs.locations, s.location(f))
	}
	return rs
}

// appendLabels appends the labels of every sample of a series, encoded.
func (s *seriesProfile) appendLabels(b []byte, row *profiler.Row) []byte {
	add := func(key, value string) {
		if value == "" {
			return
		}
		var l []byte
		l = varintField(l, labelKey, s.str(key))
		l = varintField(l, labelStr, s.str(value))
		b = bytesField(b, sampleLabel, l)
	}
	add("comm", row.Comm)
	add("kind", row.Kind.String())
	add("gpu", row.GPU())
	c := row.Container
	add("pod_uid", c.PodUID)
	add("container_id", c.ContainerID)
	add("namespace", c.Namespace)
	add("pod", c.Pod)
	add("container", c.Name)
	if row.Device.UUID != "" {
		add("gpu_uuid", row.Device.UUID)
		add("gpu_name", row.Device.Name)
	}
	var l []byte
	l = varintField(l, labelKey, s.str("pid"))
	l = varintField(l, labelNum, uint64(row.PID))
	return bytesField(b, sampleLabel, l)
}

// begin starts an interval's profile; row is its first row.
func (s *seriesProfile) begin(row *profiler.Row, interval uint64) {
	s.seen = interval
	s.labels = s.labels[:0]
	s.labels = s.appendLabels(s.labels, row)
	s.samples, s.n = s.samples[:0], 0
}

// add encodes a row's sample, unless its values are all zero, and keeps
// its counters for the next interval: what it allocated during the
// interval, what it holds at its end, and peak, its share of the
// interval's peak of its process on its GPU (pprof.PeakShares).
func (s *seriesProfile) add(row *profiler.Row, peak accounting.Amount, interval uint64) {
	rs := s.sample(row)
	rs.seen = interval
	v := pprof.NewValues(accounting.Amount{Bytes: row.AllocBytes - rs.prevAllocBytes, Count: row.AllocCount - rs.prevAllocCount},
		accounting.Amount{Bytes: row.LiveBytes(), Count: row.LiveCount()}, peak)
	rs.prevAllocCount, rs.prevAllocBytes = row.AllocCount, row.AllocBytes
	if v == (pprof.Values{}) {
		return
	}
	s.n++
	var buf [len(v) * binary.MaxVarintLen64]byte
	packed := buf[:0]
	for _, x := range v {
		packed = protowire.AppendVarint(packed, uint64(x))
	}
	size := protowire.SizeTag(sampleLocationID) + protowire.SizeBytes(len(rs.locations)) +
		protowire.SizeTag(sampleValue) + protowire.SizeBytes(len(packed)) + len(s.labels)
	b := protowire.AppendTag(s.samples, profSample, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = bytesField(b, sampleLocationID, rs.locations)
	b = bytesField(b, sampleValue, packed)
	s.samples = append(b, s.labels...)
}

// encoder writes the profiles of an interval, reusing its buffers.
type encoder struct {
	raw []byte // what follows the samples
	gz  bytes.Buffer
	zw  *gzip.Writer
}

// finish writes a series' profile of the interval's samples, taken at t
// over duration, and returns it gzipped; nil when every row's values were
// zero. Rows not seen in the interval are forgotten.
func (e *encoder) finish(s *seriesProfile, t time.Time, duration time.Duration) []byte {
	for key, rs := range s.rows {
		if rs.seen != s.seen {
			delete(s.rows, key) // no longer reported: its process was dropped
		}
	}
	if s.n == 0 {
		return nil
	}
	// The samples are written as they are; then the rest.
	raw := e.raw[:0]
	for _, st := range s.types {
		raw = appendValueType(raw, profSampleType, s.str(st.Type), s.str(st.Unit))
	}
	raw = append(raw, s.tables...)
	raw = varintField(raw, profTimeNanos, uint64(t.UnixNano()))
	raw = varintField(raw, profDurationNanos, uint64(duration.Nanoseconds()))
	raw = appendValueType(raw, profPeriodType, s.str(pprof.PeriodType), s.str(pprof.PeriodUnit))
	raw = varintField(raw, profPeriod, 1)
	raw = varintField(raw, profDefaultType, s.str(s.defaultType))
	for _, v := range s.stringList {
		raw = protowire.AppendString(protowire.AppendTag(raw, profStringTable, protowire.BytesType), v)
	}
	e.raw = raw // for the next profile
	e.gz.Reset()
	if e.zw == nil {
		// The fastest level: a profile a series every interval on every
		// node, where gzip's default would cost three times the CPU for
		// a profile a fifth smaller.
		e.zw, _ = gzip.NewWriterLevel(&e.gz, gzip.BestSpeed)
	} else {
		e.zw.Reset(&e.gz)
	}
	e.zw.Write(s.samples) // to memory: does not fail
	e.zw.Write(raw)
	e.zw.Close()
	return slices.Clone(e.gz.Bytes())
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
