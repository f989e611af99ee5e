package profiler

// Processes that exited are dropped by the profiler itself, whoever reads
// it (the agent, the IG operator behind gpumem run, top), so that a
// long run's books, stacks and per-process tables hold only the processes
// of the last intervals (issue 20). A reader reads once an interval; an
// interval begins at each interval snapshot or, for a reader that never
// takes one, at each snapshot (Report takes one). As an interval begins,
// the processes that exited before the previous one began are dropped:
// each was in that interval's snapshot after its exit, its last rows
// listed and its last peak taken. A process whose rows the latest interval
// snapshot left out (their stacks being named) is kept until a snapshot
// has them. One report at the end (gpumem record's) drops nothing.

// startInterval begins an interval if this snapshot does (interval: it
// is an interval snapshot), dropping the processes that exited before the
// previous one began. The caller holds p.books.mu.
func (p *Profiler) startInterval(interval bool) {
	b := p.books
	switch {
	case interval:
		b.byPeaks = true
	case b.byPeaks:
		return // its intervals begin at the interval snapshots
	}
	b.clock++
	previous := b.intervalAt
	b.intervalAt = b.clock
	if previous > 0 {
		p.dropExited(previous)
	}
}

// dropExited forgets the processes that exited before the interval that
// began at before: their rows, failures, stacks and per-process tables.
// Snapshots taken before keep them. A process is kept while its rows were
// left out of the latest interval snapshot, a stack of it is being named,
// or an out-of-memory snapshot of it is being delivered. The caller holds
// p.books.mu.
func (p *Profiler) dropExited(before uint64) {
	b := p.books
	var dropped []uint32
	for pid, at := range b.exitedAt {
		if at < before && !b.unlisted[pid] && !b.oomPendingFor(pid) && !p.stacks.naming(pid) {
			dropped = append(dropped, pid)
		}
	}
	if len(dropped) == 0 {
		return
	}
	drop := map[uint32]bool{}
	for _, pid := range dropped {
		drop[pid] = true
		delete(b.exitedAt, pid)
		delete(b.tensorAllocations, pid)
		p.stacks.dropProcess(pid)
		p.procs.drop(pid)
	}
	b.ledger.DropExited(func(pid uint32) bool { return !drop[pid] })
}

// Processes is how many processes the profiler keeps anything for, in its
// books or its tables: those it traces, and those that exited and are not
// dropped yet.
func (p *Profiler) Processes() int {
	p.books.mu.Lock()
	pids := p.books.ledger.PIDs()
	addKeys(pids, p.books.exitedAt)
	p.books.mu.Unlock()
	p.stacks.addPIDs(pids)
	p.procs.addPIDs(pids)
	return len(pids)
}

func addKeys[V any](set map[uint32]bool, m map[uint32]V) {
	for pid := range m {
		set[pid] = true
	}
}
