package profiler

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// timeline names the books' timeline, on the GPUs the reports are limited
// to; nil without one. The processes are the snapshot's.
func (p *Profiler) timeline(tl *accounting.Timeline, procs map[uint32]*process) *snapshot.Timeline {
	if tl == nil {
		return nil
	}
	out := &snapshot.Timeline{Start: wallTime(tl.Start), Timestamp: tl.Start, Width: time.Duration(tl.Width),
		End: time.Duration(tl.End - tl.Start)}
	frames := map[accounting.StackID][]*symbolize.Frame{} // each stack's once
	holders := map[*accounting.Holder][]snapshot.Holder{} // each shared Top once
	for _, s := range tl.Series {
		if !p.peakOnGPU(s.PeakKey) {
			continue
		}
		series := snapshot.TimelineSeries{PID: s.PID, Comm: procs[s.PID].Comm, GPU: s.GPU, View: s.View, Buckets: make([]snapshot.TimelineBucket, len(s.Buckets))}
		for i, b := range s.Buckets {
			series.Buckets[i] = snapshot.TimelineBucket{Min: b.Min, Max: b.Max, MaxTime: time.Duration(b.MaxTime - tl.Start),
				Top: p.holders(b.Top, frames, holders), Other: b.Other}
		}
		out.Series = append(out.Series, series)
	}
	slices.SortFunc(out.Series, func(a, b snapshot.TimelineSeries) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.View, b.View))
	})
	return out
}

// holders names a bucket's top rows, once per shared Top.
func (p *Profiler) holders(top []accounting.Holder, frames map[accounting.StackID][]*symbolize.Frame,
	named map[*accounting.Holder][]snapshot.Holder) []snapshot.Holder {
	if len(top) == 0 {
		return nil
	}
	if out, ok := named[&top[0]]; ok {
		return out
	}
	out := make([]snapshot.Holder, len(top))
	for i, h := range top {
		f, ok := frames[h.Stack]
		if !ok {
			f = p.stacks.stackFrames(h.Stack)
			frames[h.Stack] = f
		}
		out[i] = snapshot.Holder{Kind: h.Kind, Frames: f, Bytes: h.Bytes}
	}
	named[&top[0]] = out
	return out
}
