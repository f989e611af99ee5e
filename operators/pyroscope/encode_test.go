package pyroscope

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
	"github.com/gpu-mem/gpu-mem/pprof"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// samples describes a profile's samples as text, in an order of their own:
// what two profiles must agree on.
func samples(t *testing.T, p *profile.Profile) []string {
	t.Helper()
	if err := p.CheckValid(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range p.Sample {
		var frames []string
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				frames = append(frames, fmt.Sprintf("%s@%s:%d/%s+%#x", l.Function.Name, l.Function.Filename, l.Line, loc.Mapping.File, loc.Address))
			}
		}
		var labels []string
		for k, v := range s.Label {
			labels = append(labels, k+"="+strings.Join(v, ","))
		}
		for k, v := range s.NumLabel {
			labels = append(labels, fmt.Sprintf("%s=%v", k, v))
		}
		sort.Strings(labels)
		out = append(out, fmt.Sprintf("%v %s %s", s.Value, strings.Join(frames, ";"), strings.Join(labels, ",")))
	}
	sort.Strings(out)
	types := []string{}
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	return append(out, strings.Join(types, ","), p.DefaultSampleType, fmt.Sprint(p.TimeNanos, p.DurationNanos, p.Period, p.PeriodType.Type))
}

// TestEncodeAsPprofBuilds: the exporter's profile of a series, interval
// after interval, is what the pprof package builds from the same rows, in
// the series' view: samples, frames (native and Python), labels, values
// with each row's share of the interval's peak, and the view's own sample
// types (tensor_* for a tensor series).
func TestEncodeAsPprofBuilds(t *testing.T) {
	for _, kind := range []tracer.Kind{tracer.KindDevice, tracer.KindTensor} {
		t.Run(kind.String(), func(t *testing.T) { testEncodeAsPprofBuilds(t, kind) })
	}
}

func testEncodeAsPprofBuilds(t *testing.T, kind tracer.Kind) {
	driver := &symbolize.Frame{Function: "cuMemAlloc_v2", Module: "libcuda.so.1"}
	native := &symbolize.Frame{Function: "at::empty_cuda", Module: "/usr/lib/libtorch_cuda.so", Address: 0x1234}
	unnamed := &symbolize.Frame{Module: "/usr/lib/libfoo.so", Address: 0x99}
	python := &symbolize.Frame{Function: "load_weights", File: "train.py", Line: 42}
	c := k8smeta.Container{PodUID: "uid", ContainerID: "cid", Namespace: "ml", Pod: "trainer-1", Name: "trainer"}
	gpu := gpuinfo.Device{Name: "NVIDIA H200", UUID: "GPU-1"}
	row := func(stack accounting.StackID, frames []*symbolize.Frame, counters accounting.Counters) profiler.Row {
		return profiler.Row{Key: accounting.Key{PID: 7, Stack: stack, Kind: kind, Device: 0}, Comm: "python3",
			Device: gpu, Container: c, Frames: frames, Counters: counters}
	}
	intervals := [][]profiler.Row{
		{
			row(1, []*symbolize.Frame{driver, native, python}, accounting.Counters{AllocBytes: 100, AllocCount: 1}),
			row(2, []*symbolize.Frame{driver, python}, accounting.Counters{AllocBytes: 8, AllocCount: 2, FreeBytes: 4, FreeCount: 1}),
			row(3, []*symbolize.Frame{driver, unnamed}, accounting.Counters{AllocBytes: 1, AllocCount: 1, FreeBytes: 1, FreeCount: 1}),
		},
		{
			// 1 allocates more; 2's native frames are named now; 3 is gone.
			row(1, []*symbolize.Frame{driver, native, python}, accounting.Counters{AllocBytes: 300, AllocCount: 3, FreeBytes: 100, FreeCount: 1}),
			row(2, []*symbolize.Frame{driver, native, unnamed, python}, accounting.Counters{AllocBytes: 8, AllocCount: 2, FreeBytes: 4, FreeCount: 1}),
		},
		{
			// 3 is back: counted from nothing, as a row never seen.
			row(1, []*symbolize.Frame{driver, native, python}, accounting.Counters{AllocBytes: 300, AllocCount: 3, FreeBytes: 300, FreeCount: 3}),
			row(3, []*symbolize.Frame{driver, unnamed}, accounting.Counters{AllocBytes: 1, AllocCount: 1, FreeBytes: 1, FreeCount: 1}),
		},
	}
	// Each interval's peak: its shares, by stack (a stack freed by the
	// interval's end held memory at its peak).
	peaks := []map[accounting.StackID]accounting.Amount{
		{1: {Bytes: 100, Count: 1}, 2: {Bytes: 8, Count: 2}, 3: {Bytes: 1, Count: 1}},
		{1: {Bytes: 300, Count: 3}},
		{},
	}
	s := newSeriesProfile(kind.View())
	var enc encoder
	prev := map[accounting.Key]accounting.Counters{}
	t0 := time.Unix(1700000000, 0)
	for i, rows := range intervals {
		at := t0.Add(time.Duration(i+1) * time.Second)
		s.begin(&rows[0], uint64(i+1))
		for j := range rows {
			s.add(&rows[j], peaks[i][rows[j].Stack], uint64(i+1))
		}
		raw := enc.finish(s, at, time.Second)
		got, err := profile.ParseData(raw)
		if err != nil {
			t.Fatalf("interval %d: %v", i, err)
		}
		before := prev
		want := pprof.BuildRows(rows, at, time.Second, func(row profiler.Row) pprof.Values {
			b := before[row.Key]
			return pprof.NewValues(accounting.Amount{Bytes: row.AllocBytes - b.AllocBytes, Count: row.AllocCount - b.AllocCount},
				accounting.Amount{Bytes: row.LiveBytes(), Count: row.LiveCount()}, peaks[i][row.Stack])
		}, kind.View())
		prev = map[accounting.Key]accounting.Counters{}
		for _, row := range rows {
			prev[row.Key] = row.Counters
		}
		if g, w := samples(t, got), samples(t, want); !slices.Equal(g, w) {
			t.Errorf("interval %d:\n got %q\nwant %q", i, g, w)
		}
	}
	if len(s.rows) != 2 {
		t.Errorf("%d rows kept, want the 2 of the last interval", len(s.rows))
	}
}
