package profiler

// Processes that exited are dropped by the profiler itself, whoever reads
// it (the agent, the IG operator behind gpumem run, top), so that a
// long run's books, stacks and per-process tables hold only the processes
// of the last intervals (issue 20). A reader reads once an interval; an
// interval begins at each IntervalPeaks or, for a reader that never calls
// it, at each report (Report, ReportTo) or listing (EachRow). As an
// interval begins, the processes that exited before the previous one
// began are dropped: each was in that interval's reads after its exit,
// its last rows listed and its last peak taken, whatever the reader reads
// after the peaks. A process whose rows the latest EachRow left out (their
// stacks being named) is kept until a listing has them. One report at the
// end (gpumem record's) drops nothing.

// startInterval begins an interval if this read does (peaks: the read is
// IntervalPeaks), dropping the processes that exited before the previous
// one began. The caller holds p.mu.
func (p *Profiler) startInterval(peaks bool) {
	switch {
	case peaks:
		p.byPeaks = true
	case p.byPeaks:
		return // its intervals begin at the peaks
	}
	p.clock++
	previous := p.intervalAt
	p.intervalAt = p.clock
	if previous > 0 {
		p.dropExited(previous)
	}
}

// exited notes that pid exited now. The caller holds p.mu.
func (p *Profiler) exited(pid uint32) {
	p.clock++
	p.exitedAt[pid] = p.clock
}

// dropExited forgets the processes that exited before the interval that
// began at before: their rows, failures, stacks and per-process tables.
// Reports taken before keep them.
func (p *Profiler) dropExited(before uint64) {
	gone := func(pid uint32) bool {
		at, ok := p.exitedAt[pid]
		return ok && at < before && !p.unlisted[pid] && !p.naming(pid)
	}
	p.ledger.DropExited(func(pid uint32) bool { return !gone(pid) })
	for pid := range p.exitedAt {
		if !gone(pid) {
			continue
		}
		for _, id := range p.pidStacks[pid] {
			p.frameTable.release(p.stacks.m[id].frames)
			p.stacks.drop(id)
		}
		delete(p.pidStacks, pid)
		delete(p.comms, pid)
		delete(p.ordinals, pid)
		delete(p.containers, pid)
		delete(p.exitedAt, pid)
		p.sym.Forget(pid)
	}
}

// naming says whether a process has stacks not yet named.
func (p *Profiler) naming(pid uint32) bool {
	for _, id := range p.pidStacks[pid] {
		if !p.stacks.m[id].named() {
			return true
		}
	}
	return false
}

// Processes is how many processes the profiler keeps anything for, in its
// books or its tables: those it traces, and those that exited and are not
// dropped yet.
func (p *Profiler) Processes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	pids := p.ledger.PIDs()
	addKeys(pids, p.comms)
	addKeys(pids, p.pidStacks)
	addKeys(pids, p.ordinals)
	addKeys(pids, p.containers)
	addKeys(pids, p.exitedAt)
	return len(pids)
}

func addKeys[V any](set map[uint32]bool, m map[uint32]V) {
	for pid := range m {
		set[pid] = true
	}
}
