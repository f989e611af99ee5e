package profiler

import (
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// oomSnapshot is an OOM as taken, before its stacks are resolved.
type oomSnapshot struct {
	time    time.Time
	failure accounting.FailureKey
	bytes   uint64
	rows    map[accounting.Key]accounting.Counters
	layout  []accounting.Allocation
}

// oomRepeat bounds how far apart two failures can be one out-of-memory.
const oomRepeat = 30 * time.Second

// oomMark is the last failure a process was snapshotted for.
type oomMark struct {
	at     time.Time
	bytes  uint64
	python []tracer.PyFrame
}

// takeOOM copies the failing process's books, unless the failure repeats
// the one last snapshotted: the same size asked from the same Python frames
// (as the event carried them: code objects and instructions) within
// oomRepeat. PyTorch's allocator asks again after emptying its cache, from
// another native call site and, on a large GPU, seconds later, then reports
// its out-of-memory (memory.OpTensorOOM, of its block's size, not the
// segment's it asked the driver for); that is one out-of-memory to the
// user. The caller holds b.mu.
func (b *books) takeOOM(k accounting.FailureKey, bytes uint64, python []tracer.PyFrame) bool {
	now := time.Now()
	last, seen := b.lastOOM[k.PID]
	sameSize := last.bytes == bytes || k.Op == memory.OpTensorOOM
	if seen && sameSize && slices.Equal(last.python, python) && now.Sub(last.at) < oomRepeat {
		return false
	}
	b.lastOOM[k.PID] = oomMark{at: now, bytes: bytes, python: slices.Clone(python)}
	b.oomPending = append(b.oomPending, oomSnapshot{time: now, failure: k, bytes: bytes, rows: b.ledger.ProcessRows(k.PID),
		layout: b.ledger.AppendLive(nil, k.PID)})
	return true
}

// oomPendingFor says whether an out-of-memory snapshot of pid waits to be
// delivered. The caller holds b.mu.
func (b *books) oomPendingFor(pid uint32) bool {
	return slices.ContainsFunc(b.oomPending, func(s oomSnapshot) bool { return s.failure.PID == pid })
}

// deliverOOMs names the stacks of the snapshots taken and hands them to
// Config.OnOOM, in the order taken; snapshots keep the latest snapshot.MaxOOMs. A
// snapshot stays pending until named, so that its process is not dropped
// meanwhile. It is the job p.delivering.
func (p *Profiler) deliverOOMs() {
	pending := p.books.pendingOOMs()
	if len(pending) == 0 {
		return
	}
	p.stacks.resolving.await()
	p.gpus.await() // NVML read after the failure
	view := p.gpus.latestView()
	ooms := make([]snapshot.OOM, 0, len(pending))
	for _, s := range pending {
		o := p.oom(s)
		_, o.GPU = view.Of(o.Failure.PID, o.Failure.GPU())
		ooms = append(ooms, o)
	}
	p.books.delivered(ooms)
	if p.cfg.OnOOM != nil {
		for _, o := range ooms {
			p.cfg.OnOOM(o)
		}
	}
}

// oom names a snapshot's stacks.
func (p *Profiler) oom(s oomSnapshot) snapshot.OOM {
	procs := map[uint32]*process{s.failure.PID: nil}
	p.procs.lookup(procs)
	proc := procs[s.failure.PID]
	o := snapshot.OOM{Time: s.time, Layout: s.layout, Failure: snapshot.Failure{
		FailureKey: s.failure, Comm: proc.Comm, Frames: p.stacks.stackFrames(s.failure.Stack),
		Failures: accounting.Failures{Count: 1, Bytes: s.bytes},
	}}
	for k, c := range s.rows {
		if c.LiveBytes() > 0 {
			o.Held = append(o.Held, proc.Row(k, c, p.stacks.stackFrames(k.Stack)))
		}
	}
	snapshot.SortByLive(o.Held)
	return o
}
