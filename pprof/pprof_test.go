package pprof

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// TestViewsAreSampleTypes: the driver view under Go heap profiles' sample
// types, the default, and peak_*; the tensor view under tensor_*; each
// row's values, its share of its peak among them, in its own view's
// columns and zeros in the other's, so that no sample type sums a byte
// twice; a row not in its peak has a peak of 0.
func TestViewsAreSampleTypes(t *testing.T) {
	frames := []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "load_weights", File: "train.py", Line: 3}}
	row := func(stack accounting.StackID, kind memory.Kind, c accounting.Counters) snapshot.Row {
		return snapshot.Row{Key: accounting.Key{PID: 7, Stack: stack, Kind: kind}, Comm: "python3", Frames: frames, Counters: c}
	}
	rows := []snapshot.Row{
		row(1, memory.KindDevice, accounting.Counters{AllocBytes: 20 << 20, AllocCount: 1}),
		row(2, memory.KindTensor, accounting.Counters{AllocBytes: 16 << 20, AllocCount: 2, FreeBytes: 4 << 20, FreeCount: 1}),
		row(3, memory.KindHost, accounting.Counters{AllocBytes: 4096, AllocCount: 1}),
	}
	// At the peaks, the device row held 20 MiB, the tensor row 16 MiB, the
	// host row nothing.
	peaks := []snapshot.Peak{
		{PID: 7, GPU: "0", View: memory.ViewDriver, Amount: accounting.Amount{Bytes: 20 << 20, Count: 1},
			Shares: []accounting.PeakRow{{Key: rows[0].Key, Amount: accounting.Amount{Bytes: 20 << 20, Count: 1}}}},
		{PID: 7, GPU: "0", View: memory.ViewTensor, Amount: accounting.Amount{Bytes: 16 << 20, Count: 2},
			Shares: []accounting.PeakRow{{Key: rows[1].Key, Amount: accounting.Amount{Bytes: 16 << 20, Count: 2}}}},
	}
	var buf bytes.Buffer
	if err := Write(&buf, snapshot.Snapshot{Time: time.Unix(1700000000, 0), Peaks: peaks}.With(rows...), "how it was made"); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	want := []string{"alloc_objects/count", "alloc_space/bytes", "inuse_objects/count", "inuse_space/bytes",
		"peak_objects/count", "peak_space/bytes",
		"tensor_alloc_objects/count", "tensor_alloc_space/bytes", "tensor_inuse_objects/count", "tensor_inuse_space/bytes",
		"tensor_peak_objects/count", "tensor_peak_space/bytes"}
	if !slices.Equal(types, want) || p.DefaultSampleType != "inuse_space" || !slices.Equal(p.Comments, []string{"how it was made"}) {
		t.Fatalf("sample types %v, default %q", types, p.DefaultSampleType)
	}
	byKind := map[string][]int64{}
	for _, s := range p.Sample {
		byKind[s.Label["kind"][0]] = s.Value
	}
	for kind, values := range map[string][]int64{
		"device":      {1, 20 << 20, 1, 20 << 20, 1, 20 << 20, 0, 0, 0, 0, 0, 0},
		"host-pinned": {1, 4096, 1, 4096, 0, 0, 0, 0, 0, 0, 0, 0},
		"tensor":      {0, 0, 0, 0, 0, 0, 2, 16 << 20, 1, 12 << 20, 2, 16 << 20},
	} {
		if !slices.Equal(byKind[kind], values) {
			t.Errorf("%s values %v, want %v", kind, byKind[kind], values)
		}
	}

	// One view alone, as a Pyroscope series is: its types only, its
	// inuse_space the default, the other view's rows left out.
	enc := NewEncoder(false, memory.ViewTensor)
	for i := range rows {
		enc.Add(&rows[i], accounting.Amount{})
	}
	buf.Reset()
	if err := enc.WriteTo(&buf, time.Now(), 0); err != nil {
		t.Fatal(err)
	}
	tensors, err := profile.ParseData(buf.Bytes())
	if err != nil || len(tensors.SampleType) != 6 || tensors.DefaultSampleType != "tensor_inuse_space" || len(tensors.Sample) != 1 {
		t.Errorf("tensor view alone: %v %v", tensors, err)
	}
}
