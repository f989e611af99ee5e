// Package pprof builds pprof profiles of GPU memory, with the sample types
// of Go's heap profiles so that every pprof tool reads them as memory.
package pprof

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Values are a sample's values, in the order of the sample types:
// alloc_objects, alloc_space, inuse_objects, inuse_space.
type Values [4]int64

// Totals are a row's values since tracing began: what it allocated, and what
// it still holds.
func Totals(row profiler.Row) Values {
	return Values{int64(row.AllocCount), int64(row.AllocBytes), int64(row.LiveCount()), int64(row.LiveBytes())}
}

// Build makes a profile of the report's rows, one sample per (process,
// stack, memory kind, device), labelled with pid, comm, kind and gpu.
func Build(r profiler.Report) *profile.Profile {
	return BuildRows(r.Rows, r.Time, 0, Totals)
}

// BuildRows makes a profile taken at t over duration of the given rows,
// with the values that values gives each. Rows whose values are all zero are
// left out.
func BuildRows(rows []profiler.Row, t time.Time, duration time.Duration, values func(profiler.Row) Values) *profile.Profile {
	b := builder{
		p: &profile.Profile{
			SampleType: []*profile.ValueType{
				{Type: "alloc_objects", Unit: "count"},
				{Type: "alloc_space", Unit: "bytes"},
				{Type: "inuse_objects", Unit: "count"},
				{Type: "inuse_space", Unit: "bytes"},
			},
			DefaultSampleType: "inuse_space",
			TimeNanos:         t.UnixNano(),
			DurationNanos:     duration.Nanoseconds(),
			PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
			Period:            1,
		},
		mappings:  map[string]*profile.Mapping{},
		functions: map[string]*profile.Function{},
		locations: map[locationKey]*profile.Location{},
	}
	for _, row := range rows {
		v := values(row)
		if v == (Values{}) {
			continue
		}
		s := &profile.Sample{
			Value:    v[:],
			Label:    map[string][]string{"comm": {row.Comm}, "kind": {row.Kind.String()}, "gpu": {row.GPU()}},
			NumLabel: map[string][]int64{"pid": {int64(row.PID)}},
		}
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

// Comment returns the lines a profile carries about how it was made.
func Comment(r profiler.Report) []string {
	return []string{
		fmt.Sprintf("gpu-mem at %s", r.Time.Format(time.RFC3339)),
		fmt.Sprintf("losses: %d (ring buffer %d)", r.Losses.Total(), r.Losses.RingBufferFull),
		fmt.Sprintf("unknown frees: %d", r.Ledger.UnknownFrees),
	}
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
