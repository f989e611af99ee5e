package breakdown

import (
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

const MiB = 1 << 20

var (
	segment   = native("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block", "/usr/lib/libc10_cuda.so")
	graphPool = &symbolize.Frame{Function: memory.GraphPool}
	linear    = py("Linear.__init__", site+"torch/nn/modules/linear.py")
	adam      = py("Adam._init_group", site+"torch/optim/adam.py")
	backward  = py("backward", site+"torch/autograd/__init__.py")
	forward   = py("Block.forward", "/app/train.py")
	cublas    = native("cublasCreate_v2", "/usr/lib/libcublas.so.13")
	mainFrame = py("main", "/app/train.py")
)

func row(pid uint32, stack accounting.StackID, kind memory.Kind, device int32, live uint64, frames ...*symbolize.Frame) snapshot.Row {
	return snapshot.Row{Key: accounting.Key{PID: pid, Stack: stack, Kind: kind, Device: device}, Comm: "train",
		Frames: frames, Counters: accounting.Counters{AllocBytes: live + 3*MiB, AllocCount: 2, FreeBytes: 3 * MiB, FreeCount: 1}}
}

// A training process with its tensor view: every category's bytes exact,
// and their sum NVML's number.
func TestBreakdownOfTraining(t *testing.T) {
	rows := []snapshot.Row{
		row(7, 1, memory.KindDevice, 0, 200*MiB, segment, linear, mainFrame),
		row(7, 2, memory.KindDevice, 0, 100*MiB, segment, forward, mainFrame),
		row(7, 3, memory.KindDevice, 0, 40*MiB, graphPool, segment, forward),
		row(7, 4, memory.KindDevice, 0, 8*MiB, cublas, forward),
		row(7, 5, memory.KindTensor, 0, 120*MiB, linear, mainFrame),
		row(7, 6, memory.KindTensor, 0, 60*MiB, adam, mainFrame),
		row(7, 7, memory.KindTensor, 0, 50*MiB, backward, mainFrame),
		row(7, 8, memory.KindTensor, 0, 30*MiB, forward, mainFrame),
		row(7, 9, memory.KindTensor, 0, 32*MiB, graphPool, forward),
		row(7, 10, memory.KindContext, 0, 500*MiB, mainFrame),
		row(7, 11, memory.KindDriverInternal, 0, 70*MiB),
		row(7, 12, memory.KindHost, memory.DeviceUnknown, 64*MiB, mainFrame), // host memory: no part
		row(7, 13, memory.KindTensor, 0, 0, linear),                          // nothing live: no part
		row(8, 1, memory.KindUntraced, 0, 900*MiB),                           // not traced: no breakdown
	}
	s := snapshot.New(time.Now(), rows...)
	s.GPUMemory = &snapshot.GPUMemory{GPUs: []snapshot.GPU{{Index: 0, Processes: []snapshot.ProcessMemory{{PID: 7, GPU: "0", NVML: 918 * MiB}}}}}
	got := Of(s, nil)
	if len(got) != 1 {
		t.Fatalf("%d breakdowns, want 1: %+v", len(got), got)
	}
	b := got[0]
	want := map[string]uint64{
		"context": 500 * MiB, "parameters": 120 * MiB, "allocator_cache": 300*MiB - 260*MiB,
		"driver_internal": 70 * MiB, "optimizer_state": 60 * MiB, "gradients": 50 * MiB,
		"cuda_graph_pools": 40 * MiB, "activations": 30 * MiB, "library_workspaces/cublas": 8 * MiB,
	}
	if len(b.Parts) != len(want) {
		t.Errorf("parts %v, want %v", names(b), want)
	}
	for i, p := range b.Parts {
		if want[p.Name()] != p.Bytes {
			t.Errorf("%s: %d bytes, want %d", p.Name(), p.Bytes, want[p.Name()])
		}
		if i > 0 && p.Bytes > b.Parts[i-1].Bytes {
			t.Errorf("parts not by bytes: %v", names(b))
		}
	}
	if b.Bytes() != 918*MiB || !b.NVML || !b.TensorView || b.PID != 7 || b.GPU != "0" {
		t.Errorf("sum %d (NVML %v, tensor view %v), want 918 MiB", b.Bytes(), b.NVML, b.TensorView)
	}
	cache := part(b, snapshot.AllocatorCache)
	if len(cache.Top) != 2 || cache.Top[0].Stack != 1 || cache.Top[0].Bytes != 200*MiB || cache.Top[1].Stack != 2 {
		t.Errorf("the cache's holders: %+v, want the segments' stacks 1 and 2", cache.Top)
	}
}

// Without the tensor view the segments are one part, and without NVML
// the parts are the driver view.
func TestBreakdownWithoutTensorsOrNVML(t *testing.T) {
	s := snapshot.New(time.Now(),
		row(7, 1, memory.KindDevice, 1, 200*MiB, segment, mainFrame),
		row(7, 2, memory.KindDevice, 1, 2*MiB, native("", "/usr/bin/simwork")),
		row(7, 3, memory.KindVMM, 0, 6*MiB, native("ncclMemAlloc", "/usr/lib/libnccl.so.2")),
	)
	got := Of(s, nil)
	if len(got) != 2 || got[0].GPU != "0" || got[1].GPU != "1" {
		t.Fatalf("breakdowns %+v, want GPUs 0 and 1", got)
	}
	if got[0].Parts[0].Name() != "library_workspaces/nccl" || got[0].Bytes() != 6*MiB {
		t.Errorf("GPU 0: %v", names(got[0]))
	}
	b := got[1]
	if b.TensorView || b.NVML || len(b.Parts) != 2 ||
		part(b, snapshot.AllocatorSegments).Bytes != 200*MiB || part(b, snapshot.OtherDriver).Bytes != 2*MiB {
		t.Errorf("GPU 1: %v (tensor view %v, NVML %v)", names(b), b.TensorView, b.NVML)
	}
}

func names(b snapshot.Breakdown) map[string]uint64 {
	m := map[string]uint64{}
	for _, p := range b.Parts {
		m[p.Name()] = p.Bytes
	}
	return m
}

func part(b snapshot.Breakdown, category string) snapshot.Part {
	for _, p := range b.Parts {
		if p.Category == category {
			return p
		}
	}
	return snapshot.Part{}
}

// An on-demand tensor view that ended leaves its rows, released: the
// process's segments are one part again.
func TestBreakdownAfterTheTensorViewEnded(t *testing.T) {
	s := snapshot.New(time.Now(),
		row(7, 1, memory.KindDevice, 0, 200*MiB, segment, linear),
		row(7, 5, memory.KindTensor, 0, 0, linear),
	)
	s.TensorViews = []snapshot.TensorView{{PID: 7, Since: time.Now().Add(-time.Minute), Ended: time.Now()}}
	b := Of(s, nil)
	if len(b) != 1 || b[0].TensorView || len(b[0].Parts) != 1 || b[0].Parts[0].Category != snapshot.AllocatorSegments || b[0].Parts[0].Bytes != 200*MiB {
		t.Errorf("breakdown %+v, want the segments whole", b)
	}
}
