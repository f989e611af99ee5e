package profiler

import (
	"slices"
	"sort"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/symbolize"
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
	python []symbolize.Frame
}

// takeOOM copies the failing process's books, unless the failure repeats
// the one last snapshotted: the same size asked from the same Python frames
// within oomRepeat. PyTorch's allocator asks again after emptying its cache,
// from another native call site and, on a large GPU, seconds later; that is
// one out-of-memory to the user. The caller holds p.mu.
func (p *Profiler) takeOOM(k accounting.FailureKey, bytes uint64) {
	now := time.Now()
	python := pythonFrames(p.frames(k.Stack))
	last, seen := p.lastOOM[k.PID]
	if seen && last.bytes == bytes && slices.Equal(last.python, python) && now.Sub(last.at) < oomRepeat {
		return
	}
	p.lastOOM[k.PID] = oomMark{at: now, bytes: bytes, python: python}
	p.oomPending = append(p.oomPending, oomSnapshot{time: now, failure: k, bytes: bytes, rows: p.ledger.ProcessRows(k.PID)})
}

// pythonFrames are the Python frames of a stack, whether or not its native
// frames are resolved yet.
func pythonFrames(frames []*symbolize.Frame) []symbolize.Frame {
	var py []symbolize.Frame
	for _, f := range frames {
		if f.File != "" {
			py = append(py, *f)
		}
	}
	return py
}

// deliverOOMs resolves the stacks of the snapshots taken and hands them to
// Config.OnOOM, in the order taken; Report keeps the latest MaxOOMs.
func (p *Profiler) deliverOOMs() {
	p.delivering.Lock()
	defer p.delivering.Unlock()
	p.mu.Lock()
	pending := p.oomPending
	p.oomPending = nil
	p.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	p.resolve()
	p.mu.Lock()
	var ooms []OOM
	for _, s := range pending {
		ooms = append(ooms, p.oom(s))
	}
	p.ooms = append(p.ooms, ooms...)
	if len(p.ooms) > MaxOOMs {
		p.ooms = p.ooms[len(p.ooms)-MaxOOMs:]
	}
	p.mu.Unlock()
	if p.cfg.OnOOM != nil {
		for _, o := range ooms {
			p.cfg.OnOOM(o)
		}
	}
}

// oom names a snapshot's stacks. The caller holds p.mu.
func (p *Profiler) oom(s oomSnapshot) OOM {
	comm := p.comms[s.failure.PID]
	o := OOM{Time: s.time, Failure: Failure{
		FailureKey: s.failure, Comm: comm, Frames: p.frames(s.failure.Stack),
		Failures: accounting.Failures{Count: 1, Bytes: s.bytes},
	}}
	for k, c := range s.rows {
		if c.LiveBytes() == 0 {
			continue
		}
		o.Held = append(o.Held, Row{Key: k, Comm: comm, Device: p.device(k), Container: p.container(k.PID), Frames: p.frames(k.Stack), Counters: c})
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
