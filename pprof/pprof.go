// Package pprof builds pprof profiles of GPU memory, with the sample types
// of Go's heap profiles so that every pprof tool reads them as memory: the
// driver view under Go's names, the tensor view under its own (SampleTypes),
// and in each view the peak: each stack's share of its process's most memory
// at once on its GPU.
package pprof

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Values are a row's values, in the order of its view's sample types:
// alloc_objects, alloc_space, inuse_objects, inuse_space, peak_objects,
// peak_space.
type Values [6]int64

// Where Values and SampleTypes hold what: SampleTypes(v)[InuseSpace] is
// view v's live bytes.
const (
	AllocObjects = iota
	AllocSpace
	InuseObjects
	InuseSpace
	PeakObjects
	PeakSpace
)

// NewValues are the values of memory allocated, live and held at a peak.
func NewValues(alloc, live, peak accounting.Amount) Values {
	return Values{AllocObjects: int64(alloc.Count), AllocSpace: int64(alloc.Bytes), InuseObjects: int64(live.Count),
		InuseSpace: int64(live.Bytes), PeakObjects: int64(peak.Count), PeakSpace: int64(peak.Bytes)}
}

// Totals are a row's values since tracing began: what it allocated, what it
// still holds, and peak, its share of its process's peak on its GPU in its
// view (PeakShares).
func Totals(row profiler.Row, peak accounting.Amount) Values {
	return NewValues(accounting.Amount{Bytes: row.AllocBytes, Count: row.AllocCount},
		accounting.Amount{Bytes: row.LiveBytes(), Count: row.LiveCount()}, peak)
}

// PeakShares are each row's share of its process's peak (on its GPU, in
// its view): the rows of the peaks, by key. A row not in its peak has none.
func PeakShares(peaks []profiler.Peak) map[accounting.Key]accounting.Amount {
	shares := map[accounting.Key]accounting.Amount{}
	for _, pk := range peaks {
		for _, s := range pk.Shares {
			shares[s.Key] = s.Amount
		}
	}
	return shares
}

// SampleTypes are a view's sample types, in the order of Values. The driver
// view has Go heap profiles' own, so that a pprof reader's default
// (inuse_space) is what the GPU holds, and peak_objects and peak_space:
// each stack's share of its process's most memory at once on its GPU
// (profiler.Peak; the peaks of two processes, or of two GPUs, are reached
// at different moments, so their sum is no peak of both). The tensor view
// has the same names prefixed with "tensor_", so that it is never summed
// with the driver view and is read with -sample_index=tensor_inuse_space.
func SampleTypes(v tracer.View) []*profile.ValueType {
	prefix := ""
	if v == tracer.ViewTensor {
		prefix = "tensor_"
	}
	return []*profile.ValueType{
		AllocObjects: {Type: prefix + "alloc_objects", Unit: "count"},
		AllocSpace:   {Type: prefix + "alloc_space", Unit: "bytes"},
		InuseObjects: {Type: prefix + "inuse_objects", Unit: "count"},
		InuseSpace:   {Type: prefix + "inuse_space", Unit: "bytes"},
		PeakObjects:  {Type: prefix + "peak_objects", Unit: "count"},
		PeakSpace:    {Type: prefix + "peak_space", Unit: "bytes"},
	}
}

// Every profile's period type: memory, by the byte. Pyroscope names a
// profile type by it (name:sample type:unit:period type:period unit).
const (
	PeriodType = "space"
	PeriodUnit = "bytes"
)

// DefaultSampleType is the sample type a profile of view v opens with.
func DefaultSampleType(v tracer.View) string { return SampleTypes(v)[InuseSpace].Type }

// PeakSampleType is the sample type of view v's peak bytes.
func PeakSampleType(v tracer.View) string { return SampleTypes(v)[PeakSpace].Type }

// Build makes a profile of the report's rows, one sample per (process,
// stack, memory kind, device), labelled with pid, comm, kind and gpu, with
// both views' sample types; the peaks are the report's (every row of a
// peak is a row of the report: the same books at the same moment).
func Build(r profiler.Report) *profile.Profile {
	shares := PeakShares(r.Peaks)
	return BuildRows(r.Rows, r.Time, 0, func(row profiler.Row) Values { return Totals(row, shares[row.Key]) }, tracer.Views...)
}

// BuildRows makes a profile taken at t over duration of the given rows, with
// the values that values gives each. Its sample types are those of views,
// in order, the first view's inuse_space the default; a row's values go
// under its own view's types, zeros under the others'. Rows of other views,
// and rows whose values are all zero, are left out.
func BuildRows(rows []profiler.Row, t time.Time, duration time.Duration, values func(profiler.Row) Values, views ...tracer.View) *profile.Profile {
	b := builder{
		p: &profile.Profile{
			DefaultSampleType: DefaultSampleType(views[0]),
			TimeNanos:         t.UnixNano(),
			DurationNanos:     duration.Nanoseconds(),
			PeriodType:        &profile.ValueType{Type: PeriodType, Unit: PeriodUnit},
			Period:            1,
		},
		mappings:  map[string]*profile.Mapping{},
		functions: map[string]*profile.Function{},
		locations: map[locationKey]*profile.Location{},
	}
	column := map[tracer.View]int{} // where a view's values start
	for _, v := range views {
		column[v] = len(b.p.SampleType)
		b.p.SampleType = append(b.p.SampleType, SampleTypes(v)...)
	}
	for _, row := range rows {
		at, ok := column[row.Kind.View()]
		v := values(row)
		if !ok || v == (Values{}) {
			continue
		}
		s := &profile.Sample{
			Value:    make([]int64, len(b.p.SampleType)),
			Label:    map[string][]string{"comm": {row.Comm}, "kind": {row.Kind.String()}, "gpu": {row.GPU()}},
			NumLabel: map[string][]int64{"pid": {int64(row.PID)}},
		}
		copy(s.Value[at:], v[:])
		for name, value := range map[string]string{"pod_uid": row.Container.PodUID, "container_id": row.Container.ContainerID,
			"namespace": row.Container.Namespace, "pod": row.Container.Pod, "container": row.Container.Name} {
			if value != "" {
				s.Label[name] = []string{value}
			}
		}
		if row.Device.UUID != "" {
			s.Label["gpu_uuid"] = []string{row.Device.UUID}
			s.Label["gpu_name"] = []string{row.Device.Name}
		}
		for _, f := range row.Frames {
			s.Location = append(s.Location, b.location(*f))
		}
		b.p.Sample = append(b.p.Sample, s)
	}
	return b.p
}

// Comment returns the lines a profile carries about how it was made, and
// when each peak was reached.
func Comment(r profiler.Report) []string {
	lines := []string{
		fmt.Sprintf("gpu-mem at %s", r.Time.Format(time.RFC3339)),
		fmt.Sprintf("losses: %d (ring buffer %d)", r.Losses.Total(), r.Losses[schema.RingBufferFull]),
		fmt.Sprintf("unknown frees: %d", r.Ledger.UnknownFrees),
		"views: inuse_space and alloc_space are the driver's (what the GPU holds), tensor_inuse_space and " +
			"tensor_alloc_space PyTorch's tensors, inside the driver's segments: never add them",
		"peaks: peak_space (tensor_peak_space) is each stack's share of its process's most memory at once on its GPU; " +
			"the peaks of two processes or GPUs came at different moments: their sum is no peak",
	}
	for _, pk := range r.Peaks {
		lines = append(lines, fmt.Sprintf("peak of pid %d (%s) on gpu %s, %s view: %d bytes in %d allocations at %s",
			pk.PID, pk.Comm, pk.GPU, pk.View, pk.Bytes, pk.Count, pk.Time.Format(time.RFC3339Nano)))
	}
	return lines
}

type locationKey struct {
	module   string
	address  uint64
	function string
	file     string
	line     int64
}

type builder struct {
	p         *profile.Profile
	mappings  map[string]*profile.Mapping
	functions map[string]*profile.Function
	locations map[locationKey]*profile.Location
}

func (b *builder) location(f symbolize.Frame) *profile.Location {
	key := locationKey{f.Module, f.Address, f.Name(), f.File, f.Line}
	if loc, ok := b.locations[key]; ok {
		return loc
	}
	file := f.File // Python frames name their source file
	if file == "" {
		file = filepath.Base(f.Module)
	}
	loc := &profile.Location{
		ID:      uint64(len(b.p.Location) + 1),
		Address: f.Address,
		Mapping: b.mapping(f.Module),
		Line:    []profile.Line{{Function: b.function(f.Name(), file), Line: f.Line}},
	}
	b.p.Location = append(b.p.Location, loc)
	b.locations[key] = loc
	return loc
}

func (b *builder) mapping(module string) *profile.Mapping {
	if m, ok := b.mappings[module]; ok {
		return m
	}
	m := &profile.Mapping{
		ID:           uint64(len(b.p.Mapping) + 1),
		File:         module,
		HasFunctions: true,
	}
	b.p.Mapping = append(b.p.Mapping, m)
	b.mappings[module] = m
	return m
}

func (b *builder) function(name, file string) *profile.Function {
	key := name + "\x00" + file
	if fn, ok := b.functions[key]; ok {
		return fn
	}
	fn := &profile.Function{
		ID:         uint64(len(b.p.Function) + 1),
		Name:       name,
		SystemName: name,
		Filename:   file,
	}
	b.p.Function = append(b.p.Function, fn)
	b.functions[key] = fn
	return fn
}
