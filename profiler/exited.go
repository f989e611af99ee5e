package profiler

import "github.com/gpu-mem/gpu-mem/snapshot"

// Processes that exited are dropped when the loop that reads the profiler
// says it has read them (DropExited), so that a long run's books, stacks
// and per-process tables hold only the processes of the last intervals
// (issue 20): the agent and the IG operator behind gpumem run after each
// interval's read, top after each screen. One report at the end (gpumem
// record's) drops nothing. Reading alone never drops anything.

// DropExited forgets the processes that exited before s was taken, s
// holding their last rows: their rows, failures, stacks and per-process
// tables. Snapshots taken before keep them. A process is kept while s left
// its rows out (their stacks being named), a stack of it is being named,
// or an out-of-memory snapshot of it is being delivered: a later call
// drops it. What to drop is decided under the books' lock, the stacks and
// processes dropped after.
func (p *Profiler) DropExited(s *snapshot.Snapshot) {
	p.DropExitedBy(s.Exits, s)
}

// DropExitedBy is DropExited for the processes among the first exits exits
// the books saw (an earlier snapshot's Exits), s being the last snapshot
// read. The agent drops by the interval before s, so that an exited
// process's series stay one whole interval on /metrics: a scrape in it
// sees the exit, whenever in the interval the exit came.
func (p *Profiler) DropExitedBy(exits uint64, s *snapshot.Snapshot) {
	p.naming.Lock()
	defer p.naming.Unlock()
	candidates := p.books.exitedBy(min(exits, s.Exits), s.Waiting)
	var naming []uint32
	for _, pid := range candidates {
		if p.stacks.naming(pid) {
			naming = append(naming, pid)
		}
	}
	dropped := p.books.dropExited(candidates, naming)
	for _, pid := range dropped {
		p.stacks.dropProcess(pid)
		p.procs.drop(pid)
	}
	p.driver.forget(dropped)
}

// Processes is how many processes the profiler keeps anything for, in its
// books or its tables: those it traces, and those that exited and are not
// dropped yet.
func (p *Profiler) Processes() int {
	pids := p.books.pids()
	p.stacks.addPIDs(pids)
	p.procs.addPIDs(pids)
	return len(pids)
}

func addKeys[V any](set map[uint32]bool, m map[uint32]V) {
	for pid := range m {
		set[pid] = true
	}
}
