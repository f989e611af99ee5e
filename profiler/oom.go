package profiler

import (
	"slices"
	"sort"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// OOM is an allocation the driver refused for want of memory, with what the
// process held at that moment, in both views: the tensors of PyTorch's
// allocator and the driver memory under them. It answers "what filled the
// GPU", which the failing stack alone does not.
type OOM struct {
	Time    time.Time
	Failure Failure // the refused call: its stack, function and bytes asked
	Held    []Row   // the process's rows with live memory, by live bytes
}

// MaxOOMs is how many OOM snapshots a Report keeps, the latest.
const MaxOOMs = 64

// oomSnapshot is an OOM as taken, before its stacks are resolved.
type oomSnapshot struct {
	time    time.Time
	failure accounting.FailureKey
	bytes   uint64
	rows    map[accounting.Key]accounting.Counters
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
// another native call site and, on a large GPU, seconds later; that is one
// out-of-memory to the user. The caller holds b.mu.
func (b *books) takeOOM(k accounting.FailureKey, bytes uint64, python []tracer.PyFrame) bool {
	now := time.Now()
	last, seen := b.lastOOM[k.PID]
	if seen && last.bytes == bytes && slices.Equal(last.python, python) && now.Sub(last.at) < oomRepeat {
		return false
	}
	b.lastOOM[k.PID] = oomMark{at: now, bytes: bytes, python: slices.Clone(python)}
	b.oomPending = append(b.oomPending, oomSnapshot{time: now, failure: k, bytes: bytes, rows: b.ledger.ProcessRows(k.PID)})
	return true
}

// oomPendingFor says whether an out-of-memory snapshot of pid waits to be
// delivered. The caller holds b.mu.
func (b *books) oomPendingFor(pid uint32) bool {
	return slices.ContainsFunc(b.oomPending, func(s oomSnapshot) bool { return s.failure.PID == pid })
}

// deliverOOMs names the stacks of the snapshots taken and hands them to
// Config.OnOOM, in the order taken; snapshots keep the latest MaxOOMs. A
// snapshot stays pending until named, so that its process is not dropped
// meanwhile. It is the job p.delivering.
func (p *Profiler) deliverOOMs() {
	b := p.books
	b.mu.Lock()
	pending := slices.Clone(b.oomPending)
	b.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	p.stacks.resolving.await()
	ooms := make([]OOM, 0, len(pending))
	for _, s := range pending {
		ooms = append(ooms, p.oom(s))
	}
	b.mu.Lock()
	b.oomPending = b.oomPending[len(pending):]
	b.ooms = append(b.ooms, ooms...)
	if len(b.ooms) > MaxOOMs {
		b.ooms = b.ooms[len(b.ooms)-MaxOOMs:]
	}
	b.mu.Unlock()
	if p.cfg.OnOOM != nil {
		for _, o := range ooms {
			p.cfg.OnOOM(o)
		}
	}
}

// oom names a snapshot's stacks.
func (p *Profiler) oom(s oomSnapshot) OOM {
	procs := map[uint32]*process{s.failure.PID: nil}
	p.procs.lookup(procs)
	proc := procs[s.failure.PID]
	o := OOM{Time: s.time, Failure: Failure{
		FailureKey: s.failure, Comm: proc.comm, Frames: p.stacks.stackFrames(s.failure.Stack),
		Failures: accounting.Failures{Count: 1, Bytes: s.bytes},
	}}
	for k, c := range s.rows {
		if c.LiveBytes() > 0 {
			o.Held = append(o.Held, proc.row(k, c, p.stacks.stackFrames(k.Stack)))
		}
	}
	sortByLive(o.Held)
	return o
}

// sortByLive sorts what a process held at one moment by live bytes,
// descending.
func sortByLive(rows []Row) {
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.LiveBytes() != b.LiveBytes() {
			return a.LiveBytes() > b.LiveBytes()
		}
		return a.Kind > b.Kind // on a tie, tensors before the segments they are in
	})
}

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
