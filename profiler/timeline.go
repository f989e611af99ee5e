package profiler

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Timeline is each process's live bytes per GPU and view over time (with
// Config.Timeline), in buckets of Width from Start to End: in each, the
// lowest and highest live total, exact, and the stacks that held the most
// at the highest (accounting.Timeline says how it stays bounded).
type Timeline struct {
	Start time.Time // bucket 0's start on the wall clock
	// Timestamp is Start as a BPF timestamp (ns since boot), the clock of
	// Peak.Timestamp: a peak lies Peak.Timestamp - Timestamp after Start.
	Timestamp uint64
	Width     time.Duration
	End       time.Duration    // since Start: when the timeline was read
	Series    []TimelineSeries // by PID, GPU, view
}

// TimelineSeries is one process's live bytes on one GPU in one view.
type TimelineSeries struct {
	PID     uint32
	Comm    string
	GPU     string // as Row.GPU labels rows
	View    memory.View
	Buckets []TimelineBucket
}

// TimelineBucket is one stretch of a TimelineSeries: bucket i starts i*Width after Start.
type TimelineBucket struct {
	Min, Max uint64
	MaxTime  time.Duration // since Start: when Max was first reached
	// Top are the stacks that held the most at MaxTime, by bytes,
	// descending; Other is what the other stacks held then. They sum to
	// Max. Buckets may share a Top: read-only.
	Top   []Holder
	Other uint64
}

// Holder is what one stack held at one moment.
type Holder struct {
	Kind   memory.Kind
	Frames []*symbolize.Frame // innermost first, shared: read-only
	Bytes  uint64
}

// timeline names the books' timeline, on the GPUs the reports are limited
// to; nil without one. The processes are the snapshot's.
func (p *Profiler) timeline(tl *accounting.Timeline, procs map[uint32]*process) *Timeline {
	if tl == nil {
		return nil
	}
	out := &Timeline{Start: wallTime(tl.Start), Timestamp: tl.Start, Width: time.Duration(tl.Width),
		End: time.Duration(tl.End - tl.Start)}
	frames := map[accounting.StackID][]*symbolize.Frame{} // each stack's once
	holders := map[*accounting.Holder][]Holder{}          // each shared Top once
	for _, s := range tl.Series {
		if !p.peakOnGPU(s.PeakKey) {
			continue
		}
		series := TimelineSeries{PID: s.PID, Comm: procs[s.PID].comm, GPU: s.GPU, View: s.View, Buckets: make([]TimelineBucket, len(s.Buckets))}
		for i, b := range s.Buckets {
			series.Buckets[i] = TimelineBucket{Min: b.Min, Max: b.Max, MaxTime: time.Duration(b.MaxTime - tl.Start),
				Top: p.holders(b.Top, frames, holders), Other: b.Other}
		}
		out.Series = append(out.Series, series)
	}
	slices.SortFunc(out.Series, func(a, b TimelineSeries) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.View, b.View))
	})
	return out
}

// holders names a bucket's top rows, once per shared Top.
func (p *Profiler) holders(top []accounting.Holder, frames map[accounting.StackID][]*symbolize.Frame,
	named map[*accounting.Holder][]Holder) []Holder {
	if len(top) == 0 {
		return nil
	}
	if out, ok := named[&top[0]]; ok {
		return out
	}
	out := make([]Holder, len(top))
	for i, h := range top {
		f, ok := frames[h.Stack]
		if !ok {
			f = p.stacks.stackFrames(h.Stack)
			frames[h.Stack] = f
		}
		out[i] = Holder{Kind: h.Kind, Frames: f, Bytes: h.Bytes}
	}
	named[&top[0]] = out
	return out
}
