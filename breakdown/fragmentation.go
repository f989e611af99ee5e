package breakdown

import (
	"cmp"
	"slices"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// fragmentation measures the free space inside the allocator's segments
// outside graph pools, per process and GPU, from where the segments and
// tensors lie; frames names each allocation's stack. A gap between two
// tensors in a segment is one free block, as PyTorch's allocator keeps it
// (an inactive block of torch.cuda.memory_snapshot), to within its
// rounding: a tensor's bytes are what it asked for, its block that
// rounded up to 512 bytes (and, in the large pool, with the rest of a
// block under 1 MiB left unsplit), so a gap is larger than torch's
// inactive block by at most that. used keeps only segments holding a
// tensor: the cache as PyTorch leaves it when it has emptied itself to
// retry a failed allocation.
func fragmentation(layout []accounting.Allocation, frames func(accounting.Key) []*symbolize.Frame, used bool) map[where]*snapshot.Fragmentation {
	var segments, tensors []accounting.Allocation
	for _, a := range layout {
		switch {
		case a.Kind == memory.KindTensor:
			tensors = append(tensors, a)
		case a.Kind == memory.KindDevice && isSegment(frames(a.Key)):
			segments = append(segments, a)
		}
	}
	byAddress := func(a, b accounting.Allocation) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.Address, b.Address))
	}
	slices.SortFunc(segments, byAddress)
	slices.SortFunc(tensors, byAddress)
	out := map[where]*snapshot.Fragmentation{}
	t := 0
	for _, seg := range segments {
		for t < len(tensors) && byAddress(tensors[t], accounting.Allocation{Key: accounting.Key{PID: seg.PID}, Address: seg.Address}) < 0 {
			t++
		}
		free, largest, holds := gaps(seg, tensors[t:])
		if used && !holds {
			continue
		}
		w := where{seg.PID, seg.GPU()}
		f := out[w]
		if f == nil {
			f = &snapshot.Fragmentation{}
			out[w] = f
		}
		f.FreeInSegments += free
		f.LargestFreeBlock = max(f.LargestFreeBlock, largest)
	}
	return out
}

// gaps sums the free runs of segment seg between the tensors in it (those
// of tensors, by address, from its start on), and finds the largest;
// holds says whether any tensor lies in it.
func gaps(seg accounting.Allocation, tensors []accounting.Allocation) (free, largest uint64, holds bool) {
	end := seg.Address + seg.Bytes
	at := seg.Address
	for _, t := range tensors {
		if t.PID != seg.PID || t.Address >= end {
			break
		}
		holds = true
		if t.Address > at {
			free += t.Address - at
			largest = max(largest, t.Address-at)
		}
		at = max(at, t.Address+t.Bytes)
	}
	if end > at {
		free += end - at
		largest = max(largest, end-at)
	}
	return free, largest, holds
}

// isSegment says whether a driver allocation's stack is the allocator's
// growing its cache, outside a graph's pool.
func isSegment(frames []*symbolize.Frame) bool {
	return slices.ContainsFunc(frames, func(f *symbolize.Frame) bool { return memory.InAllocator(f.Function) }) &&
		!slices.ContainsFunc(frames, func(f *symbolize.Frame) bool { return f.Function == memory.GraphPool })
}
