package breakdown

import (
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

func alloc(stack accounting.StackID, kind memory.Kind, address, bytes uint64) accounting.Allocation {
	return accounting.Allocation{Key: accounting.Key{PID: 7, Stack: stack, Kind: kind, Device: 0}, Address: address, Bytes: bytes}
}

// Two segments of 20 MiB: the first holds tensors at its start, middle
// and end, the second none; a graph pool's segment is left out.
var layout = []accounting.Allocation{
	alloc(1, memory.KindDevice, 0x1000_0000, 20*MiB),
	alloc(5, memory.KindTensor, 0x1000_0000, 2*MiB),
	alloc(8, memory.KindTensor, 0x1000_0000+6*MiB, 4*MiB),
	alloc(8, memory.KindTensor, 0x1000_0000+19*MiB, 1*MiB),
	alloc(2, memory.KindDevice, 0x2000_0000, 20*MiB),
	alloc(3, memory.KindDevice, 0x3000_0000, 40*MiB), // a graph pool's
	alloc(9, memory.KindTensor, 0x3000_0000, 1*MiB),
}

func TestFragmentation(t *testing.T) {
	s := snapshot.New(time.Now(),
		row(7, 1, memory.KindDevice, 0, 20*MiB, segment, linear),
		row(7, 2, memory.KindDevice, 0, 20*MiB, segment, forward),
		row(7, 3, memory.KindDevice, 0, 40*MiB, graphPool, segment, forward),
		row(7, 5, memory.KindTensor, 0, 2*MiB, linear),
		row(7, 8, memory.KindTensor, 0, 5*MiB, forward),
		row(7, 9, memory.KindTensor, 0, 1*MiB, graphPool, forward),
	)
	s.Layout = layout
	b := Of(s, nil)
	want := snapshot.Fragmentation{FreeInSegments: 4*MiB + 9*MiB + 20*MiB, LargestFreeBlock: 20 * MiB}
	if len(b) != 1 || b[0].Fragmentation == nil || *b[0].Fragmentation != want {
		t.Fatalf("fragmentation %+v, want %+v", b[0].Fragmentation, want)
	}
	if c := part(b[0], snapshot.AllocatorCache); c.Bytes != want.FreeInSegments {
		t.Errorf("the cache %d bytes, want the free in segments, %d", c.Bytes, want.FreeInSegments)
	}
}

func oom(asked uint64, g *snapshot.GPU, rows ...snapshot.Row) *snapshot.OOM {
	return &snapshot.OOM{Time: time.Now(), Held: rows, GPU: g, Failure: snapshot.Failure{
		FailureKey: accounting.FailureKey{Key: accounting.Key{PID: 7, Stack: 30, Kind: memory.KindDevice, Device: 0}, Op: memory.OpMemAlloc, Result: 2},
		Comm:       "train", Failures: accounting.Failures{Count: 1, Bytes: asked}}}
}

// byAllocator makes an out-of-memory PyTorch's allocator reported, the
// driver not refusing first.
func byAllocator(o *snapshot.OOM) *snapshot.OOM {
	o.Failure.Op, o.Failure.Kind = memory.OpTensorOOM, memory.KindTensor
	return o
}

func gpu(total, used uint64, procs ...snapshot.ProcessMemory) *snapshot.GPU {
	return &snapshot.GPU{Index: 0, Total: total + 512*MiB, Reserved: 512 * MiB, Used: used, Processes: procs}
}

func TestVerdicts(t *testing.T) {
	held := []snapshot.Row{
		row(7, 1, memory.KindDevice, 0, 20*MiB, segment, linear),
		row(7, 2, memory.KindDevice, 0, 20*MiB, segment, forward),
		row(7, 5, memory.KindTensor, 0, 2*MiB, linear),
		row(7, 8, memory.KindTensor, 0, 5*MiB, forward),
	}
	me := snapshot.ProcessMemory{PID: 7, GPU: "0", NVML: 40*MiB + 500*MiB, Traced: true, Driver: 40 * MiB, Contexts: 500 * MiB}
	withLayout := func(o *snapshot.OOM) *snapshot.OOM { o.Layout = layout[:5]; return o }
	for _, c := range []struct {
		name  string
		oom   *snapshot.OOM
		want  string
		why   string
		parts int
	}{
		{"the cache had the bytes in pieces", withLayout(oom(12*MiB, gpu(1000*MiB, 1000*MiB, me), held...)), snapshot.FragmentationVerdict,
			"PyTorch's cache held 13631488 bytes free, enough for the 12582912 asked, but its largest free block was 9437184 bytes", 4},
		{"the process alone filled the GPU", oom(600*MiB, gpu(1000*MiB, 1000*MiB, me, snapshot.ProcessMemory{PID: 9, GPU: "0", NVML: 460 * MiB}), held...),
			snapshot.Demand, "the process held 566231040 bytes and asked 629145600 more of a GPU of 1048576000; the most in context (524288000)", 4},
		{"a neighbour held the rest", oom(300*MiB, gpu(1000*MiB, 1000*MiB, me, snapshot.ProcessMemory{PID: 9, Comm: "other", GPU: "0", NVML: 460 * MiB}), held...),
			snapshot.AnotherProcess, "other processes held the rest, the most pid 9 (other) with 482344960", 4},
		{"the GPU had room", oom(300*MiB, gpu(1000*MiB, 540*MiB, me), held...), snapshot.Limit,
			"the driver refused 314572800 bytes with 482344960 free on the GPU", 4},
		{"PyTorch's own limit", byAllocator(oom(300*MiB, gpu(1000*MiB, 540*MiB, me), held...)), snapshot.Limit,
			"PyTorch's allocator refused 314572800 bytes without asking the driver, with 482344960 free on the GPU: a limit of its own", 4},
		{"PyTorch's own limit, without NVML", byAllocator(oom(300*MiB, nil, held...)), snapshot.Limit,
			"PyTorch's allocator refused 314572800 bytes without asking the driver: a limit of its own (torch.cuda.set_per_process_memory_fraction)", 3},
		{"PyTorch's report of a full GPU", byAllocator(oom(600*MiB, gpu(1000*MiB, 1000*MiB, me), held...)), snapshot.Demand,
			"the process held 566231040 bytes and asked 629145600 more", 4},
		{"without NVML or tensors", oom(300*MiB, nil, held[:2]...), snapshot.Demand, "the process held 41943040 bytes and asked 314572800 more; the most in allocator_segments", 1},
	} {
		v := Judge(c.oom, nil)
		if v.Verdict != c.want || !strings.Contains(v.Why, c.why) || len(v.Breakdown.Parts) != c.parts {
			t.Errorf("%s: %s (%s), %d parts %v; want %s (%s), %d parts", c.name, v.Verdict, v.Why, len(v.Breakdown.Parts), names(v.Breakdown), c.want, c.why, c.parts)
		}
	}
}
