// Package accounting keeps the exact books of GPU memory: every live
// allocation by process and pointer, per (process, stack, kind) the bytes
// and counts allocated, freed and still live, and per process, GPU and view
// the peaks of live memory with the rows that held them (peak.go).
package accounting

import (
	"maps"

	"github.com/gpu-mem/gpu-mem/memory"
)

// StackID names an interned call stack; the ledger never looks inside.
type StackID uint64

// Key identifies one row of the books.
type Key struct {
	PID    uint32
	Stack  StackID
	Kind   memory.Kind
	Device int32 // device ordinal, or memory.DeviceUnknown
}

// GPU names where the row's memory lives (see memory.GPU).
func (k Key) GPU() string { return memory.GPU(k.Kind, k.Device) }

// Counters are one row of the books. Live memory is what was allocated and
// neither freed nor released by the process's exit.
type Counters struct {
	AllocBytes, AllocCount               uint64
	FreeBytes, FreeCount                 uint64
	ImplicitFreeBytes, ImplicitFreeCount uint64 // released when the process exited
}

// Add adds o's counts to c's.
func (c *Counters) Add(o Counters) {
	c.AllocBytes += o.AllocBytes
	c.AllocCount += o.AllocCount
	c.FreeBytes += o.FreeBytes
	c.FreeCount += o.FreeCount
	c.ImplicitFreeBytes += o.ImplicitFreeBytes
	c.ImplicitFreeCount += o.ImplicitFreeCount
}

// Subtract takes o's counts from c's, which hold them.
func (c *Counters) Subtract(o Counters) {
	c.AllocBytes -= o.AllocBytes
	c.AllocCount -= o.AllocCount
	c.FreeBytes -= o.FreeBytes
	c.FreeCount -= o.FreeCount
	c.ImplicitFreeBytes -= o.ImplicitFreeBytes
	c.ImplicitFreeCount -= o.ImplicitFreeCount
}

// LiveBytes is the memory this row still holds.
func (c Counters) LiveBytes() uint64 { return c.AllocBytes - c.FreeBytes - c.ImplicitFreeBytes }

// LiveCount is the number of allocations this row still holds.
func (c Counters) LiveCount() uint64 { return c.AllocCount - c.FreeCount - c.ImplicitFreeCount }

// FailureKey identifies failed allocations with the same origin and error.
type FailureKey struct {
	Key
	Op     memory.Op
	Result int32
}

// Failures counts failed allocation calls and the bytes they asked for.
type Failures struct {
	Count, Bytes uint64
}

// Add adds o's counts to f's.
func (f *Failures) Add(o Failures) {
	f.Count += o.Count
	f.Bytes += o.Bytes
}

// Stats are the ledger's own counts of what it could not match.
type Stats struct {
	// UnknownFrees are frees of pointers never seen allocated: memory
	// allocated before the tracer attached, whose event was lost, or a
	// pointer the driver refuses to free (a free's result is not read).
	UnknownFrees uint64 `json:"unknown_frees"`
	// UnknownFreesBy counts them by the function called.
	UnknownFreesBy map[string]uint64 `json:"unknown_frees_by,omitempty"`
	// ProcessExits are traced processes seen exiting.
	ProcessExits uint64 `json:"process_exits"`
	// FreesBeforeView are frees, in a view started while its process ran
	// (the tensor view switched on mid-run), of memory allocated before
	// the view started: neither unknown nor subtracted from anything.
	FreesBeforeView uint64 `json:"frees_before_view,omitempty"`
}

// Ledger is not safe for concurrent use.
type Ledger struct {
	procs    map[uint32]*process
	exited   map[uint32]bool // since the last DropExited
	rows     map[Key]*row
	groups   map[PeakKey]*group // each row's, for peaks
	failures map[FailureKey]*Failures
	stats    Stats
	timeline *timeline // nil unless StartTimeline
	// intervalRows holds the rows of the last interval's peaks, and the
	// next interval's: TakeIntervalPeaks reuses it.
	intervalRows []PeakRow
	// before is each row's allocations replayed from a previous agent's
	// books (EndReplay); nil without.
	before map[Key]Amount
}

type process struct {
	live map[address]allocation
	// late are the name spaces whose view started while the process ran:
	// a free there of an address never seen allocated was allocated
	// before.
	late map[memory.Space]bool
	// superseded holds allocations whose pointer the driver handed out
	// again before their free was seen: a free racing with a reuse on
	// another thread. The free, stamped earlier, still releases them.
	superseded map[address][]allocation
}

// address is a pointer, a VMM handle or a tensor pointer, each in its own
// name space.
type address struct {
	value uint64
	space memory.Space
}

type allocation struct {
	row   *row
	bytes uint64
	time  uint64 // when the driver returned it
	refs  uint32 // a VMM handle's references beyond its creation's
}

// New returns empty books.
func New() *Ledger {
	return &Ledger{
		procs:    map[uint32]*process{},
		exited:   map[uint32]bool{},
		rows:     map[Key]*row{},
		groups:   map[PeakKey]*group{},
		failures: map[FailureKey]*Failures{},
	}
}

func (l *Ledger) process(pid uint32) *process {
	p, ok := l.procs[pid]
	if !ok {
		p = &process{live: map[address]allocation{}, superseded: map[address][]allocation{}}
		l.procs[pid] = p
	}
	return p
}

// row returns the row of k, created at time ts if new.
func (l *Ledger) row(k Key, ts uint64) *row {
	r, ok := l.rows[k]
	if !ok {
		g := l.group(peakKey(k), ts)
		r = &row{group: g, stack: k.Stack, kind: k.Kind, device: k.Device, changed: g.sealed}
		g.rows = append(g.rows, r)
		l.rows[k] = r
	}
	return r
}

// Alloc records a successful allocation returned at time ts.
func (l *Ledger) Alloc(k Key, addr uint64, space memory.Space, bytes, ts uint64) {
	p := l.process(k.PID)
	a := address{addr, space}
	if old, ok := p.live[a]; ok {
		// The driver handed the address out again, so it freed the old
		// allocation first: it holds no memory any more, though its free
		// event is still to come.
		p.superseded[a] = append(p.superseded[a], old)
		old.row.unhold(old.bytes, ts)
	}
	row := l.row(k, ts)
	row.AllocBytes += bytes
	row.AllocCount++
	row.hold(bytes, ts)
	p.live[a] = allocation{row: row, bytes: bytes, time: ts}
}

// Free records a free of op (its result unread) that entered the driver at
// time ts.
func (l *Ledger) Free(pid uint32, op memory.Op, addr uint64, ts uint64) {
	p := l.procs[pid]
	a := address{addr, op.Space()}
	if p == nil {
		l.unknownFree(op)
		return
	}
	if cur, ok := p.live[a]; ok && cur.time < ts {
		if cur.refs > 0 {
			cur.refs-- // the handle lives until its last reference goes
			p.live[a] = cur
			return
		}
		delete(p.live, a)
		release(cur)
		cur.row.unhold(cur.bytes, ts)
		return
	}
	if older := p.superseded[a]; len(older) > 0 {
		release(older[0]) // left the peaks' totals when superseded
		if len(older) == 1 {
			delete(p.superseded, a)
		} else {
			p.superseded[a] = older[1:]
		}
		return
	}
	if p.late[a.space] {
		l.stats.FreesBeforeView++
		return
	}
	l.unknownFree(op)
}

// StartView has the process's view of space begin now, while the process
// runs (the tensor view switched on): its frees of addresses never seen
// allocated are of memory allocated before, counted as FreesBeforeView.
func (l *Ledger) StartView(pid uint32, space memory.Space) {
	p := l.process(pid)
	if p.late == nil {
		p.late = map[memory.Space]bool{}
	}
	p.late[space] = true
}

// EndView closes the process's view of space at time ts (the tensor view
// switched off): what it still held there is released implicitly, since
// its frees will not be seen, and the view is no longer late.
func (l *Ledger) EndView(pid uint32, space memory.Space, ts uint64) {
	p := l.procs[pid]
	if p == nil {
		return
	}
	p.releaseImplicitly(ts, func(s memory.Space) bool { return s == space })
	delete(p.late, space)
}

// releaseImplicitly releases, at time ts, what the process holds in the
// name spaces in accepts, its frees not to be seen.
func (p *process) releaseImplicitly(ts uint64, in func(memory.Space) bool) {
	for a, alloc := range p.live {
		if in(a.space) {
			releaseImplicitly(alloc)
			alloc.row.unhold(alloc.bytes, ts)
			delete(p.live, a)
		}
	}
	for a, older := range p.superseded {
		if in(a.space) {
			for _, alloc := range older {
				releaseImplicitly(alloc) // out of the peaks' totals already
			}
			delete(p.superseded, a)
		}
	}
}

func (l *Ledger) unknownFree(op memory.Op) {
	l.stats.UnknownFrees++
	if l.stats.UnknownFreesBy == nil {
		l.stats.UnknownFreesBy = map[string]uint64{}
	}
	l.stats.UnknownFreesBy[op.Symbol()]++
}

// Retain records one more reference to a live VMM handle
// (cuMemRetainAllocationHandle): it takes one more Free to release it. A
// handle gpu-mem never saw created is left alone; its releases are unknown
// frees.
func (l *Ledger) Retain(pid uint32, handle uint64) {
	p := l.procs[pid]
	if p == nil {
		return
	}
	a := address{handle, memory.SpaceHandle}
	if cur, ok := p.live[a]; ok {
		cur.refs++
		p.live[a] = cur
	}
}

func release(a allocation) {
	a.row.FreeBytes += a.bytes
	a.row.FreeCount++
}

// Allocated says when the live allocation at addr in space was made, if
// the process holds one there.
func (l *Ledger) Allocated(pid uint32, space memory.Space, addr uint64) (ts uint64, ok bool) {
	p := l.procs[pid]
	if p == nil {
		return 0, false
	}
	a, ok := p.live[address{addr, space}]
	return a.time, ok
}

// Carry adds to k's row counts of allocations whose events are gone (a
// journal compacted): they hold nothing.
func (l *Ledger) Carry(k Key, c Counters, ts uint64) {
	l.process(k.PID)
	l.row(k, ts).Add(c)
}

// CarryFailures adds to k's failures those whose events are gone.
func (l *Ledger) CarryFailures(k FailureKey, f Failures) {
	l.failure(k).Add(f)
}

// EndReplay keeps what each row allocated so far as its Before: the books
// a previous agent left are replayed, what comes next is this agent's.
func (l *Ledger) EndReplay() {
	l.before = make(map[Key]Amount, len(l.rows))
	for k, r := range l.rows {
		l.before[k] = Amount{Bytes: r.AllocBytes, Count: r.AllocCount}
	}
}

// Before is what row k had allocated when the books a previous agent left
// were replayed (EndReplay): what was pushed before this agent began.
func (l *Ledger) Before(k Key) Amount { return l.before[k] }

// IntervalLow is the least live bytes row k held since the interval began
// (TakeIntervalPeaks): 0 for a row made during it.
func (l *Ledger) IntervalLow(k Key) uint64 {
	if r, ok := l.rows[k]; ok {
		return r.low
	}
	return 0
}

// Fail records an allocation call that returned an error.
func (l *Ledger) Fail(k Key, op memory.Op, result int32, bytes uint64) {
	f := l.failure(FailureKey{Key: k, Op: op, Result: result})
	f.Count++
	f.Bytes += bytes
}

func (l *Ledger) failure(k FailureKey) *Failures {
	f, ok := l.failures[k]
	if !ok {
		f = &Failures{}
		l.failures[k] = f
	}
	return f
}

// Exit releases everything the process still held, as implicit frees, at
// time ts (the timeline's).
func (l *Ledger) Exit(pid uint32, ts uint64) {
	p, ok := l.procs[pid]
	if !ok {
		l.exited[pid] = true // it may have failed allocations only
		return
	}
	p.releaseImplicitly(ts, func(memory.Space) bool { return true })
	delete(l.procs, pid)
	l.exited[pid] = true
	l.stats.ProcessExits++
}

func releaseImplicitly(a allocation) {
	a.row.ImplicitFreeBytes += a.bytes
	a.row.ImplicitFreeCount++
}

// DropExited removes the rows and failures of processes that exited, but
// those keep says are not yet exported, and returns the processes dropped: a
// long-running agent calls it once their last numbers are exported, so that
// the books stay bounded. A process kept is dropped by a later call.
func (l *Ledger) DropExited(keep func(pid uint32) bool) map[uint32]bool {
	dropped := l.exited
	l.exited = map[uint32]bool{}
	for pid := range dropped {
		if keep(pid) {
			delete(dropped, pid)
			l.exited[pid] = true
		}
	}
	for k := range l.rows {
		if dropped[k.PID] && l.procs[k.PID] == nil {
			delete(l.rows, k)
			delete(l.before, k)
		}
	}
	for k := range l.failures {
		if dropped[k.PID] && l.procs[k.PID] == nil {
			delete(l.failures, k)
		}
	}
	for k := range l.groups {
		if dropped[k.PID] && l.procs[k.PID] == nil {
			delete(l.groups, k)
		}
	}
	return dropped
}

// ProcessRows copies the rows of one process.
func (l *Ledger) ProcessRows(pid uint32) map[Key]Counters {
	rows := map[Key]Counters{}
	for k, r := range l.rows {
		if k.PID == pid {
			rows[k] = r.Counters
		}
	}
	return rows
}

// LivePIDs are the processes that hold memory in the books.
func (l *Ledger) LivePIDs() []uint32 {
	pids := make([]uint32, 0, len(l.procs))
	for pid := range l.procs {
		pids = append(pids, pid)
	}
	return pids
}

// PIDs are the processes the books hold anything for: live allocations,
// rows, failures, or an exit not yet dropped.
func (l *Ledger) PIDs() map[uint32]bool {
	pids := map[uint32]bool{}
	for pid := range l.procs {
		pids[pid] = true
	}
	for pid := range l.exited {
		pids[pid] = true
	}
	for k := range l.rows {
		pids[k.PID] = true
	}
	for k := range l.failures {
		pids[k.PID] = true
	}
	for k := range l.groups {
		pids[k.PID] = true
	}
	return pids
}

// Len is the number of rows of the books.
func (l *Ledger) Len() int { return len(l.rows) }

// Row returns one row of the books, if it is there.
func (l *Ledger) Row(k Key) (Counters, bool) {
	r, ok := l.rows[k]
	if !ok {
		return Counters{}, false
	}
	return r.Counters, true
}

// Allocation is one live allocation where it lies.
type Allocation struct {
	Key
	Address, Bytes uint64
}

// AppendLive appends process pid's live allocations of kind device
// memory and tensors to to: where PyTorch's segments and tensors lie, for
// the allocator's fragmentation. Allocations of another name space (VMM
// handles) have no place.
func (l *Ledger) AppendLive(to []Allocation, pid uint32) []Allocation {
	p := l.procs[pid]
	if p == nil {
		return to
	}
	for a, live := range p.live {
		if (a.space == memory.SpacePointer || a.space == memory.SpaceTensor) &&
			(live.row.kind == memory.KindDevice || live.row.kind == memory.KindTensor) {
			k := Key{PID: pid, Stack: live.row.stack, Kind: live.row.kind, Device: live.row.device}
			to = append(to, Allocation{Key: k, Address: a.value, Bytes: live.bytes})
		}
	}
	return to
}

// Rows calls fn with each row of the books, without copying them: for
// reports of many rows, every interval. fn must not call the ledger.
func (l *Ledger) Rows(fn func(Key, Counters)) {
	for k, r := range l.rows {
		fn(k, r.Counters)
	}
}

// EachFailure calls fn with each count of failed allocations.
func (l *Ledger) EachFailure(fn func(FailureKey, Failures)) {
	for k, f := range l.failures {
		fn(k, *f)
	}
}

// Stats are the ledger's counts of what it could not match.
func (l *Ledger) Stats() Stats {
	s := l.stats
	s.UnknownFreesBy = maps.Clone(s.UnknownFreesBy)
	return s
}

// Snapshot is a copy of the books at one moment.
type Snapshot struct {
	Rows     map[Key]Counters
	Failures map[FailureKey]Failures
	Stats    Stats
}

// Snapshot copies the books.
func (l *Ledger) Snapshot() Snapshot {
	s := Snapshot{
		Rows:     make(map[Key]Counters, len(l.rows)),
		Failures: make(map[FailureKey]Failures, len(l.failures)),
		Stats:    l.Stats(),
	}
	for k, r := range l.rows {
		s.Rows[k] = r.Counters
	}
	for k, f := range l.failures {
		s.Failures[k] = *f
	}
	return s
}
