package pprof

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
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

// expectedSamples are what samples must say of a profile of rows, each
// with the values that values gives it, in view: the oracle, made without
// the encoder.
func expectedSamples(rows []snapshot.Row, values func(snapshot.Row) Values, view memory.View, at time.Time, duration time.Duration) []string {
	var out []string
	for _, row := range rows {
		v := values(row)
		if v == (Values{}) {
			continue
		}
		var frames []string
		for _, f := range row.Frames {
			file := f.File
			if file == "" {
				file = filepath.Base(f.Module)
			}
			frames = append(frames, fmt.Sprintf("%s@%s:%d/%s+%#x", f.Name(), file, f.Line, f.Module, f.Address))
		}
		labels := []string{fmt.Sprintf("pid=[%d]", row.PID)}
		for name, value := range rowLabels(&row) {
			labels = append(labels, name+"="+value)
		}
		sort.Strings(labels)
		out = append(out, fmt.Sprintf("%v %s %s", v[:], strings.Join(frames, ";"), strings.Join(labels, ",")))
	}
	sort.Strings(out)
	var types []string
	for _, st := range SampleTypes(view) {
		types = append(types, st.Type+"/"+st.Unit)
	}
	return append(out, strings.Join(types, ","), DefaultSampleType(view), fmt.Sprint(at.UnixNano(), duration.Nanoseconds(), 1, PeriodType))
}

// TestEncodeIntervals: an encoder's profiles of a series, interval after
// interval (a Pyroscope series'): samples, frames (native and Python),
// labels, values with what each row allocated during the interval and its
// share of the interval's peak, and the view's own sample types (tensor_*
// for a tensor series).
func TestEncodeIntervals(t *testing.T) {
	for _, kind := range []memory.Kind{memory.KindDevice, memory.KindTensor} {
		t.Run(kind.String(), func(t *testing.T) { testEncodeIntervals(t, kind) })
	}
}

func testEncodeIntervals(t *testing.T, kind memory.Kind) {
	driver := &symbolize.Frame{Function: "cuMemAlloc_v2", Module: "libcuda.so.1"}
	native := &symbolize.Frame{Function: "at::empty_cuda", Module: "/usr/lib/libtorch_cuda.so", Address: 0x1234}
	unnamed := &symbolize.Frame{Module: "/usr/lib/libfoo.so", Address: 0x99}
	python := &symbolize.Frame{Function: "load_weights", File: "train.py", Line: 42}
	c := container.Identity{PodUID: "uid", ContainerID: "cid", Namespace: "ml", Pod: "trainer-1", Name: "trainer"}
	gpu := gpuinfo.Device{Name: "NVIDIA H200", UUID: "GPU-1"}
	row := func(stack accounting.StackID, frames []*symbolize.Frame, counters accounting.Counters) snapshot.Row {
		return snapshot.Row{Key: accounting.Key{PID: 7, Stack: stack, Kind: kind, Device: 0}, Comm: "python3",
			Device: gpu, Container: c, Frames: frames, Counters: counters}
	}
	intervals := [][]snapshot.Row{
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
	enc := NewEncoder(true, kind.View())
	prev := map[accounting.Key]accounting.Counters{}
	t0 := time.Unix(1700000000, 0)
	for i, rows := range intervals {
		at := t0.Add(time.Duration(i+1) * time.Second)
		for j := range rows {
			enc.Add(&rows[j], peaks[i][rows[j].Stack])
		}
		var raw bytes.Buffer
		if err := enc.WriteTo(&raw, at, time.Second); err != nil {
			t.Fatal(err)
		}
		got, err := profile.ParseData(raw.Bytes())
		if err != nil {
			t.Fatalf("interval %d: %v", i, err)
		}
		before := prev
		want := expectedSamples(rows, func(row snapshot.Row) Values {
			b := before[row.Key]
			return NewValues(accounting.Amount{Bytes: row.AllocBytes - b.AllocBytes, Count: row.AllocCount - b.AllocCount},
				accounting.Amount{Bytes: row.LiveBytes(), Count: row.LiveCount()}, peaks[i][row.Stack])
		}, kind.View(), at, time.Second)
		prev = map[accounting.Key]accounting.Counters{}
		for _, row := range rows {
			prev[row.Key] = row.Counters
		}
		if g := samples(t, got); !slices.Equal(g, want) {
			t.Errorf("interval %d:\n got %q\nwant %q", i, g, want)
		}
	}
	if len(enc.rows) != 2 {
		t.Errorf("%d rows kept, want the 2 of the last interval", len(enc.rows))
	}
}
