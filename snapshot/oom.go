package snapshot

import (
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
)

// OOM is an allocation the driver refused for want of memory, with what the
// process held at that moment, in both views: the tensors of PyTorch's
// allocator and the driver memory under them. It answers "what filled the
// GPU", which the failing stack alone does not.
type OOM struct {
	Time    time.Time
	Failure Failure // the refused call: its stack, function and bytes asked
	Held    []Row   // the process's rows with live memory, by live bytes
	// Layout is where its segments and tensors lay (with the tensor
	// view).
	Layout []accounting.Allocation
	// GPU is what NVML said the GPU held just after (every process on it);
	// nil without NVML.
	GPU *GPU
	// Verdict is why it happened: set by its reader (breakdown.Judge),
	// nil until.
	Verdict *Verdict
}

// MaxOOMs is how many OOM snapshots a Snapshot keeps, the latest.
const MaxOOMs = 64

// HeldBy sums the live bytes of an OOM's rows of one kind.
func (o OOM) HeldBy(kind memory.Kind) uint64 {
	var n uint64
	for _, r := range o.Held {
		if r.Kind == kind {
			n += r.LiveBytes()
		}
	}
	return n
}

// Snapshot is what the process held, as a snapshot of its own.
func (o OOM) Snapshot() *Snapshot { return New(o.Time, o.Held...) }
