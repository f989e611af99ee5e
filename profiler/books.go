package profiler

import (
	"sync"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// books are the ledger and what is counted beside it. The goroutine that
// reads events feeds them (account), and what it does here touches memory
// only; readers take snapshots of them (snapshot.go).
type books struct {
	mu     sync.Mutex
	ledger *accounting.Ledger
	events uint64 // events read
	// tensorAllocations counts each process's tensor allocations, for the
	// tensor view's budget.
	tensorAllocations map[uint32]uint64
	python            snapshot.PythonStats // but Processes, which the process table counts
	nativeTruncated   uint64               // allocations whose native stack was cut at the depth limit
	// Out of memory (oom.go): snapshots taken, not yet delivered; the
	// latest MaxOOMs delivered; each process's last.
	oomPending []oomSnapshot
	ooms       []snapshot.OOM
	lastOOM    map[uint32]oomMark
	// Exited processes, until dropped (exited.go).
	exits    uint64            // exits seen: orders them and the snapshots
	exitedAt map[uint32]uint64 // processes that exited, when (exits)
	// losses are the tracer's last counts, kept when it is closed.
	losses schema.Losses
	closed bool
}

func newBooks() *books {
	return &books{ledger: accounting.New(), lastOOM: map[uint32]oomMark{}, exitedAt: map[uint32]uint64{},
		tensorAllocations: map[uint32]uint64{}}
}

// account enters one event, its stack interned as id; python says its
// process is a registered Python process. True when it took an
// out-of-memory snapshot.
func (b *books) account(ev *tracer.Event, id accounting.StackID, python bool) (oom bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events++
	if _, exited := b.exitedAt[ev.PID]; exited && !ev.Exit {
		// The PID was taken again by a new process before the exited one
		// was dropped: not dropped while the new one lives, the two share
		// the books (rows stay apart where their stacks differ).
		delete(b.exitedAt, ev.PID)
	}
	switch {
	case ev.Exit:
		b.exitLocked(ev.PID, ev.Timestamp)
	case ev.Op.IsFree():
		b.ledger.Free(ev.PID, ev.Op, ev.Address, ev.Timestamp)
	case ev.Op.IsRetain():
		b.ledger.Retain(ev.PID, ev.Address)
	case ev.Result == memory.CUDASuccess:
		if ev.Op == memory.OpTensorAlloc {
			b.tensorAllocations[ev.PID]++
		}
		b.countStacks(ev, python)
		b.ledger.Alloc(key(ev, id), ev.Address, ev.Op.Space(), ev.Bytes, ev.Timestamp)
	default:
		b.countStacks(ev, python)
		k := key(ev, id)
		b.ledger.Fail(k, ev.Op, ev.Result, ev.Bytes)
		if ev.Result == memory.CUDAOutOfMemory {
			return b.takeOOM(accounting.FailureKey{Key: k, Op: ev.Op, Result: ev.Result}, ev.Bytes, ev.PyFrames)
		}
	}
	return false
}

// key is the row an allocation event goes to. Host and managed memory do
// not live on the device of the context they were made in.
func key(ev *tracer.Event, id accounting.StackID) accounting.Key {
	k := accounting.Key{PID: ev.PID, Stack: id, Kind: ev.Op.Kind(), Device: ev.Device}
	if k.Kind == memory.KindHost || k.Kind == memory.KindManaged {
		k.Device = memory.DeviceUnknown
	}
	return k
}

// countStacks counts how whole an allocation event's stacks are: native
// ones cut at the depth limit, and the Python frames of a registered
// Python process.
func (b *books) countStacks(ev *tracer.Event, python bool) {
	if ev.Flags&tracer.NativeTruncated != 0 {
		b.nativeTruncated++
	}
	if !python {
		return
	}
	s := &b.python
	s.Events++
	if len(ev.PyFrames) == 0 {
		s.Missing++
	}
	if ev.Flags&tracer.PyNoThread != 0 {
		s.NoThread++
	}
	if ev.Flags&tracer.PyTruncated != 0 {
		s.Truncated++
	}
	if ev.Flags&tracer.PyReadError != 0 {
		s.ReadErrors++
	}
}

// exit releases what a process that exited at time ts held. Its rows stay
// until it is dropped (exited.go).
func (b *books) exit(pid uint32, ts uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.exitLocked(pid, ts)
}

func (b *books) exitLocked(pid uint32, ts uint64) {
	b.ledger.Exit(pid, ts)
	b.exits++
	b.exitedAt[pid] = b.exits
	delete(b.lastOOM, pid)
}

// livePIDs are the processes holding memory.
func (b *books) livePIDs() []uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ledger.LivePIDs()
}

// close keeps the tracer's last loss counts, read as it closes.
func (b *books) close(losses schema.Losses) {
	b.mu.Lock()
	b.losses, b.closed = losses, true
	b.mu.Unlock()
}
