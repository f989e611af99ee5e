package report

import (
	"cmp"
	"slices"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// The driver view and the tensor view overlap (memory.View): every output
// shows them apart, and these are the totals each shows.

// ViewTotal sums the counters of the rows of one view.
func ViewTotal(rows []snapshot.Row, v memory.View) accounting.Counters {
	var sum accounting.Counters
	for _, row := range rows {
		if row.Kind.View() == v {
			sum.Add(row.Counters)
		}
	}
	return sum
}

// HasTensors says whether any row is in the tensor view: without PyTorch's
// allocator traced, outputs need not mention the view.
func HasTensors(rows []snapshot.Row) bool {
	return slices.ContainsFunc(rows, func(row snapshot.Row) bool { return row.Kind.View() == memory.ViewTensor })
}

// ViewName is how outputs for people name a view.
func ViewName(v memory.View) string {
	if v == memory.ViewTensor {
		return "tensors (tensor view)"
	}
	return "GPU memory (driver view)"
}

// ProcessGPU is one process's live memory on one GPU (or host, managed) in
// each view, side by side and never added.
type ProcessGPU struct {
	PID  uint32
	Comm string
	GPU  string
	// Held is the driver view: what the process holds from the driver.
	Held uint64
	// Tensors is the tensor view: what its tensors hold.
	Tensors uint64
	// Segments is the part of Held that PyTorch's caching allocator got
	// from the driver (AllocatorSegment) for its own pools: what PyTorch
	// calls reserved, less GraphPool.
	Segments uint64
	// GraphPool is the part of Held that the allocator got for CUDA graphs'
	// private pools (GraphPoolRow), charged to the stacks that captured
	// them; GraphPoolTensors the part of Tensors allocated in them.
	GraphPool, GraphPoolTensors uint64
}

// Cache is the allocator's cache: the segments of its own pools less the
// tensors in them, PyTorch's reserved minus allocated outside graph pools
// (here with the tensors' own sizes, so the allocator's rounding counts as
// cache). false when the segments hold less than the tensors: segments made
// before gpu-mem attached are not seen, and the difference would mean
// nothing.
func (p ProcessGPU) Cache() (uint64, bool) {
	tensors := p.Tensors - p.GraphPoolTensors
	if p.Segments < tensors {
		return 0, false
	}
	return p.Segments - tensors, true
}

// ByProcessGPU sums live bytes per process and GPU in each view, ordered by
// pid, then GPU.
func ByProcessGPU(rows []snapshot.Row) []ProcessGPU {
	type key struct {
		pid uint32
		gpu string
	}
	index := map[key]int{}
	var out []ProcessGPU
	for _, row := range rows {
		k := key{row.PID, row.GPU()}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, ProcessGPU{PID: row.PID, Comm: row.Comm, GPU: k.gpu})
		}
		p := &out[i]
		live, pool := row.LiveBytes(), GraphPoolRow(row.Frames)
		switch {
		case row.Kind.View() == memory.ViewTensor:
			p.Tensors += live
			if pool {
				p.GraphPoolTensors += live
			}
		case pool: // only the allocator's segments carry the mark (memory.InAllocator)
			p.Held += live
			p.GraphPool += live
		case AllocatorSegment(row.Frames):
			p.Held += live
			p.Segments += live
		default:
			p.Held += live
		}
	}
	slices.SortFunc(out, func(a, b ProcessGPU) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPU, b.GPU))
	})
	return out
}

// AllocatorSegment says whether a driver allocation is a segment of
// PyTorch's caching allocator: its stack passes through the allocator
// (memory.InAllocator). Only such segments hold tensors, so only they
// make the allocator's cache; the rest of the driver view (the CUDA
// context's own allocations, cuBLAS, NCCL) is no cache.
func AllocatorSegment(frames []*symbolize.Frame) bool {
	return slices.ContainsFunc(frames, func(f *symbolize.Frame) bool {
		return memory.InAllocator(f.Function)
	})
}

// GraphPoolRow says whether a row's memory was made for a CUDA graph's
// private pool: its stack ends in memory.GraphPool's frame.
func GraphPoolRow(frames []*symbolize.Frame) bool {
	return len(frames) > 0 && frames[0].Module == "" && frames[0].Function == memory.GraphPool
}
