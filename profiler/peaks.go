package profiler

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/nvmlparts"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// namedPeaks are the run's peaks, on the GPUs the reports are limited to,
// by PID, GPU and view, with their Shares and their rows named (Rows). The
// processes are the snapshot's.
func (p *Profiler) namedPeaks(procs map[uint32]*process, peaks []accounting.Peak) []snapshot.Peak {
	out := p.sharedPeaks(procs, peaks)
	for i := range out {
		pk := &out[i]
		proc := procs[pk.PID]
		pk.Rows = make([]snapshot.Row, 0, len(pk.Shares))
		for _, r := range pk.Shares {
			share := accounting.Counters{AllocBytes: r.Bytes, AllocCount: r.Count}
			pk.Rows = append(pk.Rows, proc.Row(r.Key, share, p.rowFrames(r.Key)))
		}
		snapshot.SortByLive(pk.Rows)
	}
	return out
}

// sharedPeaks are the books' peaks, on the GPUs the reports are limited to,
// by PID, GPU and view, with their Shares: the rows by key, not named. The
// processes are the snapshot's.
func (p *Profiler) sharedPeaks(procs map[uint32]*process, peaks []accounting.Peak) []snapshot.Peak {
	out := make([]snapshot.Peak, 0, len(peaks))
	for _, pk := range peaks {
		if !p.peakOnGPU(pk.PeakKey) {
			continue
		}
		proc := procs[pk.PID]
		out = append(out, snapshot.Peak{PID: pk.PID, Comm: proc.Comm, GPU: pk.GPU, Device: proc.peakDevice(pk.PeakKey),
			Container: proc.Container, View: pk.View, Timestamp: pk.Time, Time: wallTime(pk.Time),
			Amount: pk.Amount, Shares: pk.Rows})
	}
	slices.SortFunc(out, func(a, b snapshot.Peak) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.View, b.View))
	})
	return out
}

// rowFrames are the frames of a row of a peak: its stack's, or for NVML's
// driver internals, a stack out of the store's range, the frame that says
// what they are.
func (p *Profiler) rowFrames(k accounting.Key) []*symbolize.Frame {
	if k.Stack == nvmlparts.StackDriverInternal {
		return []*symbolize.Frame{frameDriverInternal}
	}
	return p.stacks.stackFrames(k.Stack)
}

// peakOnGPU is onGPU for a peak: whether its GPU is one the reports are
// limited to.
func (p *Profiler) peakOnGPU(k accounting.PeakKey) bool {
	if len(p.cfg.GPUs) == 0 {
		return true
	}
	return slices.ContainsFunc(p.cfg.GPUs, func(gpu int) bool { return strconv.Itoa(gpu) == k.GPU })
}

// peakDevice is the GPU a peak is on, if the driver says which it is.
func (p *process) peakDevice(k accounting.PeakKey) gpuinfo.Device {
	ordinal, err := strconv.Atoi(k.GPU)
	if err != nil {
		return gpuinfo.Device{}
	}
	return p.GPUs[ordinal]
}
