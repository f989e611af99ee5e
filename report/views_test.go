package report

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

const MiB = 1 << 20

var (
	allocFrames = []*symbolize.Frame{
		{Function: "cuMemAlloc_v2"},
		{Function: "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block"},
		{Function: "load_weights", File: "train.py", Line: 3},
	}
	tensorFrames = []*symbolize.Frame{
		{Function: "pytorch:malloc"},
		{Function: "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
		{Function: "load_weights", File: "train.py", Line: 3},
	}
	cublasFrames = []*symbolize.Frame{{Function: "cuMemAlloc_v2"}, {Function: "cublasCreate_v2"}}
)

// viewRows: a PyTorch process holding a 20 MiB allocator segment with
// 12 MiB of tensors in it and 6 MiB from cuBLAS on GPU 0, and 4 KiB pinned;
// another process without PyTorch.
func viewRows() []snapshot.Row {
	row := func(pid uint32, stack accounting.StackID, kind memory.Kind, frames []*symbolize.Frame, c accounting.Counters) snapshot.Row {
		return snapshot.Row{Key: accounting.Key{PID: pid, Stack: stack, Kind: kind}, Comm: "python3", Frames: frames, Counters: c}
	}
	return []snapshot.Row{ // by live bytes, as reports are
		row(7, 1, memory.KindDevice, allocFrames, accounting.Counters{AllocBytes: 20 * MiB, AllocCount: 1}),
		row(7, 2, memory.KindTensor, tensorFrames, accounting.Counters{AllocBytes: 16 * MiB, AllocCount: 2, FreeBytes: 4 * MiB, FreeCount: 1}),
		row(8, 4, memory.KindDevice, cublasFrames, accounting.Counters{AllocBytes: 8 * MiB, AllocCount: 1}),
		row(7, 3, memory.KindDevice, cublasFrames, accounting.Counters{AllocBytes: 6 * MiB, AllocCount: 1}),
		row(7, 5, memory.KindHost, cublasFrames, accounting.Counters{AllocBytes: 4096, AllocCount: 1}),
	}
}

// TestByProcessGPU: each view per process and GPU, side by side; the
// allocator's segments told from the rest of the driver view by its frames;
// its cache is its segments less its tensors.
func TestByProcessGPU(t *testing.T) {
	got := ByProcessGPU(viewRows())
	want := []ProcessGPU{
		{PID: 7, Comm: "python3", GPU: "0", Held: 26 * MiB, Tensors: 12 * MiB, Segments: 20 * MiB},
		{PID: 7, Comm: "python3", GPU: "host", Held: 4096},
		{PID: 8, Comm: "python3", GPU: "0", Held: 8 * MiB},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if cache, ok := got[0].Cache(); !ok || cache != 8*MiB {
		t.Errorf("cache %d, %v; want 8 MiB", cache, ok)
	}
	// Segments made before gpu-mem attached are not seen: no cache to tell.
	if _, ok := (ProcessGPU{Tensors: 2, Segments: 1}).Cache(); ok {
		t.Error("a cache smaller than nothing")
	}
}

// TestGraphPoolPart: a CUDA graph's pool (rows whose stacks end in the
// pool's mark) is a part of its own: its segments out of the allocator's,
// its tensors out of those the cache is reckoned against; its stacks' hottest
// frame is the capture's, not the mark.
func TestGraphPoolPart(t *testing.T) {
	pool := &symbolize.Frame{Function: memory.GraphPool}
	record := &symbolize.Frame{Function: "CUDAGraphNode._record", File: "cudagraph_trees.py", Line: 9}
	rows := append(viewRows(),
		snapshot.Row{Key: accounting.Key{PID: 7, Stack: 6, Kind: memory.KindDevice}, Comm: "python3",
			Frames: []*symbolize.Frame{pool, allocFrames[0], allocFrames[1], record}, Counters: accounting.Counters{AllocBytes: 62 * MiB, AllocCount: 2}},
		snapshot.Row{Key: accounting.Key{PID: 7, Stack: 7, Kind: memory.KindTensor}, Comm: "python3",
			Frames: []*symbolize.Frame{pool, tensorFrames[0], tensorFrames[1], record}, Counters: accounting.Counters{AllocBytes: 50 * MiB, AllocCount: 1}})
	got := ByProcessGPU(rows)[0]
	want := ProcessGPU{PID: 7, Comm: "python3", GPU: "0", Held: 88 * MiB, Tensors: 62 * MiB, Segments: 20 * MiB,
		GraphPool: 62 * MiB, GraphPoolTensors: 50 * MiB}
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if cache, ok := got.Cache(); !ok || cache != 8*MiB {
		t.Errorf("cache %d, %v; want 8 MiB, the graph pool's left out", cache, ok)
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, snapshot.Snapshot{}.With(rows...)); err != nil {
		t.Fatal(err)
	}
	if want := `"segments":20971520,"graph_pool":65011712,"cache":8388608`; !strings.Contains(page.String(), want) {
		t.Errorf("the HTML report's summary lacks %s", want)
	}
	if name := HottestFrame(rows[len(rows)-2].Frames); name != "CUDAGraphNode._record" {
		t.Errorf("hottest frame %q", name)
	}
	if name := HottestFrame([]*symbolize.Frame{pool, allocFrames[0], allocFrames[1]}); name != allocFrames[1].Function {
		t.Errorf("hottest native frame %q, want the driver's caller", name)
	}
}

// TestFoldedPerView: folded output holds one view, never both.
func TestFoldedPerView(t *testing.T) {
	r := snapshot.Snapshot{}.With(viewRows()...)
	for view, want := range map[memory.View]string{
		memory.ViewDriver: "python3;gpu=0;cublasCreate_v2;cuMemAlloc_v2 14680064\n" +
			"python3;gpu=0;load_weights;c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block;cuMemAlloc_v2 20971520\n" +
			"python3;gpu=host;cublasCreate_v2;cuMemAlloc_v2 4096\n",
		memory.ViewTensor: "python3;gpu=0;load_weights;c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc;pytorch:malloc 12582912\n",
	} {
		var buf bytes.Buffer
		if err := WriteFolded(&buf, r, InUse, view); err != nil {
			t.Fatal(err)
		}
		if buf.String() != want {
			t.Errorf("%s view:\n%s\nwant\n%s", view, buf.String(), want)
		}
	}
}

// TestStacksAndTopNameTheViews: record's --top summary lists each view's
// stacks under its name, with its total; top's lines total each view.
func TestStacksAndTopNameTheViews(t *testing.T) {
	r := snapshot.Snapshot{Time: time.Now()}.With(viewRows()...)
	var buf bytes.Buffer
	if err := WriteStacks(&buf, r, 2); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(buf.String(), "\n")
	var headings []string
	for _, l := range lines {
		if strings.HasPrefix(l, "GPU memory") || strings.HasPrefix(l, "tensors") || strings.Contains(l, " live, ") && !strings.HasPrefix(l, " ") {
			headings = append(headings, l)
		}
	}
	want := []string{
		"GPU memory (driver view), stacks holding the most:",
		"20.0 MiB live, 20.0 MiB allocated by 1 calls: pid 7 (python3), device memory, gpu 0",
		"8.0 MiB live, 8.0 MiB allocated by 1 calls: pid 8 (python3), device memory, gpu 0",
		"tensors (tensor view), stacks holding the most:",
		"12.0 MiB live, 16.0 MiB allocated by 2 calls: pid 7 (python3), tensor memory, gpu 0",
		"GPU memory (driver view): 34.0 MiB live, 34.0 MiB allocated",
		"tensors (tensor view): 12.0 MiB live, 16.0 MiB allocated (inside the driver view's segments: not added to it)",
	}
	if !slices.Equal(headings, want) {
		t.Errorf("summary:\n%s\nwant the lines\n%s", buf.String(), strings.Join(want, "\n"))
	}

	buf.Reset()
	if err := WriteTop(&buf, r, 0, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range want[5:] {
		if !strings.Contains(buf.String(), "\n"+want+"\n") {
			t.Errorf("top has no line %q:\n%s", want, buf.String())
		}
	}

	// Without tensors, the driver view alone.
	buf.Reset()
	WriteStacks(&buf, snapshot.Snapshot{}.With(viewRows()[2:3]...), 5)
	if strings.Contains(buf.String(), "tensor") {
		t.Errorf("a tensor view without tensors:\n%s", buf.String())
	}
}
