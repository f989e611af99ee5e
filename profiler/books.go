package profiler

import (
	"maps"
	"slices"
	"sync"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvmlparts"
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
	// driverAllocations counts each process's driver allocations, for
	// the driver view's budget.
	driverAllocations map[uint32]uint64
	// contexts are the GPUs each process made a CUDA context on: its
	// device series exist from then on, at zero before its first
	// allocation, so that a rate or increase of its counters counts that
	// allocation too.
	contexts        map[nvmlparts.ProcessDevice]bool
	python          snapshot.PythonStats // but Processes, which the process table counts
	nativeTruncated uint64               // allocations whose native stack was cut at the depth limit
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
	// replaying: the events are a previous agent's, replayed from its
	// journal (state.go): their out-of-memory snapshots were its.
	replaying bool
}

func newBooks() *books {
	return &books{ledger: accounting.New(), lastOOM: map[uint32]oomMark{}, exitedAt: map[uint32]uint64{},
		tensorAllocations: map[uint32]uint64{}, driverAllocations: map[uint32]uint64{}, contexts: map[nvmlparts.ProcessDevice]bool{}}
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
		return false
	case ev.Op.MakesContext():
		// Its size is NVML's, beside the ledger (gpumemory.go); its
		// process's device series start here.
		b.contexts[nvmlparts.ProcessDevice{PID: ev.PID, Device: ev.Device}] = true
	case ev.Op.IsFree(), ev.Op.IsRetain(), ev.Op == memory.OpCtxDestroy, ev.Op.LoadsModule(), ev.Op.UnloadsModule():
	case ev.Result == memory.CUDASuccess:
		if ev.Op == memory.OpTensorAlloc {
			b.tensorAllocations[ev.PID]++
		} else {
			b.driverAllocations[ev.PID]++
		}
		b.countStacks(ev, python)
	default: // failed
		b.countStacks(ev, python)
		oom = ev.Result == memory.CUDAOutOfMemory && !b.replaying
	}
	k := key(ev, id)
	applyToLedger(b.ledger, ev, k)
	if oom {
		return b.takeOOM(accounting.FailureKey{Key: k, Op: ev.Op, Result: ev.Result}, ev.Bytes, ev.PyFrames)
	}
	return false
}

// applyToLedger enters an allocation, free or failure in l, to row k;
// contexts and modules are sized beside the ledger (gpumemory.go), exits
// released by the caller.
func applyToLedger(l *accounting.Ledger, ev *tracer.Event, k accounting.Key) {
	switch {
	case ev.Exit, ev.Op.MakesContext(), ev.Op == memory.OpCtxDestroy, ev.Op.LoadsModule(), ev.Op.UnloadsModule():
	case ev.Op.IsFree():
		l.Free(ev.PID, ev.Op, ev.Address, ev.Timestamp)
	case ev.Op.IsRetain():
		l.Retain(ev.PID, ev.Address)
	case ev.Result == memory.CUDASuccess:
		l.Alloc(k, ev.Address, ev.Op.Space(), ev.Bytes, ev.Timestamp)
	default:
		l.Fail(k, ev.Op, ev.Result, ev.Bytes)
	}
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

// livePIDs are the processes holding memory, or a CUDA context: those
// whose end must be seen, if not by their exit then by their absence.
func (b *books) livePIDs() []uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	pids := b.ledger.LivePIDs()
	for pd := range b.contexts {
		if _, exited := b.exitedAt[pd.PID]; !exited && !slices.Contains(pids, pd.PID) {
			pids = append(pids, pd.PID)
		}
	}
	return pids
}

// close keeps the tracer's last loss counts, read as it closes.
func (b *books) close(losses schema.Losses) {
	b.mu.Lock()
	b.losses, b.closed = losses, true
	b.mu.Unlock()
}

// lastLosses are the tracer's last loss counts, kept as it closed, and
// whether it did.
func (b *books) lastLosses() (schema.Losses, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.losses, b.closed
}

// pids are the processes the books keep anything for: those that hold or
// did anything, and those that exited and are not dropped yet.
func (b *books) pids() map[uint32]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	pids := b.ledger.PIDs()
	addKeys(pids, b.exitedAt)
	for pd := range b.contexts {
		pids[pd.PID] = true
	}
	return pids
}

// readRun copies the books into s, the rows and failures that keep says,
// notes their processes in procs, and returns the run's peaks and, with
// timeline, the timeline. It changes nothing.
func (b *books) readRun(s *snapshot.Snapshot, procs map[uint32]*process, keep func(accounting.Key) bool,
	timeline bool) ([]accounting.Peak, *accounting.Timeline) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.copyLocked(s, procs, keep)
	if !timeline {
		return b.ledger.Peaks(), nil
	}
	tl := b.ledger.Timeline(bpfNow())
	return b.ledger.Peaks(), &tl
}

// endInterval ends the interval the books' peaks and rows' low-water marks
// are in and begins the next: it copies the rows and failures that keep
// says into s, notes their processes in procs, and returns the
// interval's peaks, their rows copied into s (Snapshot.KeepShares): the
// ledger reuses its own.
func (b *books) endInterval(s *snapshot.Snapshot, procs map[uint32]*process, keep func(accounting.Key) bool) []accounting.Peak {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.copyLocked(s, procs, keep)
	peaks := b.ledger.TakeIntervalPeaks(bpfNow())
	for i := range peaks {
		peaks[i].Rows = s.KeepShares(peaks[i].Rows)
	}
	return peaks
}

// copyLocked copies the rows and failures that keep says into s, and
// notes their processes in procs. The caller holds b.mu.
func (b *books) copyLocked(s *snapshot.Snapshot, procs map[uint32]*process, keep func(accounting.Key) bool) {
	s.Exits = b.exits
	s.Ledger, s.Python, s.NativeTruncated, s.Events = b.ledger.Stats(), b.python, b.nativeTruncated, b.events
	s.OOMs = slices.Clone(b.ooms)
	s.Entries = slices.Grow(s.Entries, b.ledger.Len())
	tensors := map[uint32]bool{}
	b.ledger.Rows(func(k accounting.Key, c accounting.Counters) {
		if keep(k) {
			s.Entries = append(s.Entries, snapshot.Entry{Key: k, Counters: c, Before: b.ledger.Before(k), Low: b.ledger.IntervalLow(k)})
			procs[k.PID] = nil
			tensors[k.PID] = tensors[k.PID] || k.Kind == memory.KindTensor
		}
	})
	for pid, with := range tensors {
		if with {
			s.Layout = b.ledger.AppendLive(s.Layout, pid)
		}
	}
	b.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if keep(k.Key) {
			s.Failures = append(s.Failures, snapshot.Failure{FailureKey: k, Failures: f})
			procs[k.PID] = nil
		}
	})
}

// liveOnDevices sums the driver view's live bytes on GPUs per process and
// device (memory.DeviceUnknown where the context was not seen created):
// what NVML's per-process numbers hold of the traced memory.
func (b *books) liveOnDevices() map[nvmlparts.ProcessDevice]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	live := map[nvmlparts.ProcessDevice]uint64{}
	b.ledger.Rows(func(k accounting.Key, c accounting.Counters) {
		if k.Kind.View() == memory.ViewDriver && k.Kind.OnDevice() && k.Device != memory.DeviceHost {
			live[nvmlparts.ProcessDevice{PID: k.PID, Device: k.Device}] += c.LiveBytes()
		}
	})
	return live
}

// sum sums the rows and failures that keep says per series.
func (b *books) sum(keep func(accounting.Key) bool) snapshot.Totals {
	b.mu.Lock()
	defer b.mu.Unlock()
	stats := b.ledger.Stats()
	t := snapshot.Totals{UnknownFrees: stats.UnknownFrees, FreesBeforeView: stats.FreesBeforeView, Events: b.events}
	series := newSeriesSums(&t)
	b.ledger.Rows(func(k accounting.Key, c accounting.Counters) {
		if keep(k) {
			series.add(k, c)
		}
	})
	for pd := range b.contexts {
		if k := (accounting.Key{PID: pd.PID, Kind: memory.KindDevice, Device: pd.Device}); keep(k) {
			series.add(k, accounting.Counters{}) // at zero until its first allocation
		}
	}
	type failureKey struct {
		snapshot.SeriesKey
		result int32
	}
	failures := map[failureKey]int{}
	b.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if !keep(k.Key) {
			return
		}
		fk := failureKey{snapshot.SeriesOf(k.Key), k.Result}
		i, ok := failures[fk]
		if !ok {
			i = len(t.Failures)
			failures[fk] = i
			t.Failures = append(t.Failures, snapshot.SeriesFailures{SeriesKey: fk.SeriesKey, Result: k.Result})
		}
		t.Failures[i].Count += f.Count
	})
	return t
}

// pendingOOMs are the out-of-memory snapshots taken and not delivered.
func (b *books) pendingOOMs() []oomSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.oomPending)
}

// delivered keeps the first len(ooms) pending snapshots, named, as
// delivered: the latest snapshot.MaxOOMs.
func (b *books) delivered(ooms []snapshot.OOM) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.oomPending = b.oomPending[len(ooms):]
	b.ooms = append(b.ooms, ooms...)
	if len(b.ooms) > snapshot.MaxOOMs {
		b.ooms = b.ooms[len(b.ooms)-snapshot.MaxOOMs:]
	}
}

// exitedBy are the processes that exited by the time the books had seen
// exits exits, but those waiting, or with an out-of-memory snapshot not
// yet delivered.
func (b *books) exitedBy(exits uint64, waiting []uint32) []uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var pids []uint32
	for pid, at := range b.exitedAt {
		if at <= exits && !slices.Contains(waiting, pid) && !b.oomPendingFor(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// dropExited drops the books of candidates, but those of keep and those
// whose PID a new process took since they were chosen, and returns the
// processes dropped.
func (b *books) dropExited(candidates, keep []uint32) []uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	drop := map[uint32]bool{}
	for _, pid := range candidates {
		if _, exited := b.exitedAt[pid]; exited {
			drop[pid] = true
		}
	}
	for _, pid := range keep {
		delete(drop, pid)
	}
	if len(drop) == 0 {
		return nil
	}
	dropped := make([]uint32, 0, len(drop))
	for pid := range drop {
		delete(b.exitedAt, pid)
		delete(b.tensorAllocations, pid)
		delete(b.driverAllocations, pid)
		dropped = append(dropped, pid)
	}
	for pd := range b.contexts {
		if drop[pd.PID] {
			delete(b.contexts, pd)
		}
	}
	b.ledger.DropExited(func(pid uint32) bool { return !drop[pid] })
	return dropped
}

// startTensorView has pid's tensor books begin while it runs.
func (b *books) startTensorView(pid uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ledger.StartView(pid, memory.SpaceTensor)
}

// endTensorView closes pid's tensor books at ts.
func (b *books) endTensorView(pid uint32, ts uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ledger.EndView(pid, memory.SpaceTensor, ts)
}

// tensorAllocs returns each process's tensor allocations so far.
func (b *books) tensorAllocs() map[uint32]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.tensorAllocations)
}

// endDriverView closes pid's driver books at ts (its driver view switched
// off): what it held there is released implicitly.
func (b *books) endDriverView(pid uint32, ts uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, space := range []memory.Space{memory.SpacePointer, memory.SpaceHandle} {
		b.ledger.EndView(pid, space, ts)
	}
	delete(b.driverAllocations, pid)
}

// driverAllocs returns each process's driver allocations so far.
func (b *books) driverAllocs() map[uint32]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.driverAllocations)
}
