package breakdown

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Fill sets s's breakdown and each out-of-memory's verdict, by rules
// (Default when nil).
func Fill(s *snapshot.Snapshot, rules *Rules) {
	s.Breakdown = Of(s, rules)
	pods := map[uint32]container.Identity{}
	for i := range s.Entries {
		if p := s.Entries[i].Process; p != nil {
			pods[s.Entries[i].PID] = p.Container
		}
	}
	for i := range s.OOMs {
		v := Judge(&s.OOMs[i], rules)
		for j := range v.Neighbours {
			v.Neighbours[j].Container = pods[v.Neighbours[j].PID]
		}
		s.OOMs[i].Verdict = v
	}
}

// Judge says why an out-of-memory happened: from what its process held
// then (its rows and where its segments and tensors lay) and what NVML
// said the GPU held just after. In that order: a limit (PyTorch's allocator
// refused without asking the driver, or the GPU had the bytes free), fragmentation (PyTorch's cache had them free, in pieces),
// another process (the process's own use and the bytes asked fit the GPU),
// else demand.
func Judge(o *snapshot.OOM, rules *Rules) *snapshot.Verdict {
	asked := o.Failure.Bytes
	gpu := o.Failure.GPU()
	held := snapshot.New(o.Time, o.Held...)
	v := &snapshot.Verdict{Asked: asked}
	if b := Of(held, rules); len(b) > 0 {
		for _, pb := range b {
			if pb.GPU == gpu {
				v.Breakdown = pb
			}
		}
	}
	v.Breakdown.PID, v.Breakdown.GPU, v.Breakdown.Comm = o.Failure.PID, gpu, o.Failure.Comm
	frames := map[accounting.Key][]*symbolize.Frame{}
	for _, r := range o.Held {
		frames[r.Key] = r.Frames
	}
	if v.Breakdown.TensorView {
		frag := fragmentation(o.Layout, func(k accounting.Key) []*symbolize.Frame { return frames[k] }, true)
		v.Fragmentation = frag[where{o.Failure.PID, gpu}]
		if v.Fragmentation == nil {
			v.Fragmentation = &snapshot.Fragmentation{}
		}
		v.Breakdown.Fragmentation = v.Fragmentation
	}
	own := addNVMLParts(v, o.GPU)
	switch {
	case o.Failure.Op == memory.OpTensorOOM && (o.GPU == nil || v.Free >= asked):
		// The allocator reported it with no refusal of the driver before:
		// a refusal's out-of-memory is the driver call's (takeOOM).
		v.Verdict = snapshot.Limit
		v.Why = fmt.Sprintf("PyTorch's allocator refused %d bytes without asking the driver", asked)
		if o.GPU != nil {
			v.Why += fmt.Sprintf(", with %d free on the GPU", v.Free)
		}
		v.Why += ": a limit of its own (torch.cuda.set_per_process_memory_fraction)"
	case o.GPU != nil && v.Free >= asked:
		v.Verdict = snapshot.Limit
		v.Why = fmt.Sprintf("the driver refused %d bytes with %d free on the GPU: a limit below the GPU's size (a MIG slice)", asked, v.Free)
	case v.Fragmentation != nil && v.Fragmentation.FreeInSegments >= asked:
		v.Verdict = snapshot.FragmentationVerdict
		v.Why = fmt.Sprintf("PyTorch's cache held %d bytes free, enough for the %d asked, but its largest free block was %d bytes: "+
			"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would have served it", v.Fragmentation.FreeInSegments, asked, v.Fragmentation.LargestFreeBlock)
	case o.GPU != nil && len(v.Neighbours) > 0 && own+asked <= usable(o.GPU):
		n := v.Neighbours[0]
		v.Verdict = snapshot.AnotherProcess
		v.Why = fmt.Sprintf("the process held %d bytes and asked %d of a GPU of %d: other processes held the rest, the most pid %d (%s) with %d",
			own, asked, usable(o.GPU), n.PID, n.Comm, n.NVML)
	default:
		v.Verdict = snapshot.Demand
		v.Why = fmt.Sprintf("the process held %d bytes and asked %d more", own, asked)
		if o.GPU != nil {
			v.Why += fmt.Sprintf(" of a GPU of %d", usable(o.GPU))
		}
		if len(v.Breakdown.Parts) > 0 {
			v.Why += fmt.Sprintf("; the most in %s (%d)", v.Breakdown.Parts[0].Name(), v.Breakdown.Parts[0].Bytes)
		}
	}
	return v
}

// addNVMLParts adds to the verdict's breakdown what NVML said of the
// process (its contexts, modules and driver internals) and of the GPU (its
// free bytes, the other processes), and returns the process's bytes on
// the GPU: NVML's number, else its breakdown's.
func addNVMLParts(v *snapshot.Verdict, g *snapshot.GPU) uint64 {
	if g == nil {
		return v.Breakdown.Bytes()
	}
	v.Free = usable(g) - min(g.Used, usable(g))
	var own uint64
	for _, p := range g.Processes {
		if p.PID != v.Breakdown.PID {
			v.Neighbours = append(v.Neighbours, snapshot.Neighbour{ProcessMemory: p})
			continue
		}
		own = p.NVML
		v.Breakdown.NVML = true
		for category, bytes := range map[string]uint64{snapshot.Context: p.Contexts, snapshot.Modules: p.Modules,
			snapshot.DriverInternal: uint64(max(p.DriverInternal, 0))} {
			if bytes > 0 {
				v.Breakdown.Parts = append(v.Breakdown.Parts, snapshot.Part{Category: category, Bytes: bytes})
			}
		}
	}
	sortParts(v.Breakdown.Parts)
	slices.SortFunc(v.Neighbours, func(a, b snapshot.Neighbour) int { return cmp.Compare(b.NVML, a.NVML) })
	if !v.Breakdown.NVML {
		return v.Breakdown.Bytes()
	}
	return own
}

// usable is what the GPU's processes can have: its memory less what the
// driver sets aside.
func usable(g *snapshot.GPU) uint64 { return g.Total - min(g.Reserved, g.Total) }
