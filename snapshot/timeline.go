package snapshot

import (
	"time"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Timeline is each process's live bytes per GPU and view over time (when
// the profiler keeps one), in buckets of Width from Start to End: in each, the
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
