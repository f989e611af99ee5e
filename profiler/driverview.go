package profiler

import (
	"slices"
	"sync"
	"time"

	"github.com/gpu-mem/gpu-mem/budget"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// driverSwitch measures each process's driver view against its budget
// and keeps the views it switched off.
type driverSwitch struct {
	mu     sync.Mutex
	budget budget.Budget
	rates  budget.Rates
	off    map[uint32]snapshot.DriverViewOff
	// exceeded counts the views switched off, dropped ones included.
	exceeded uint64
}

func newDriverSwitch(b budget.Budget) *driverSwitch {
	return &driverSwitch{budget: b, rates: budget.Rates{}, off: map[uint32]snapshot.DriverViewOff{}}
}

// updateDriverViews is the scan's part for the driver view's budget: a
// process whose driver allocations over the last window cost it more than
// the budget has its driver view switched off.
func (p *Profiler) updateDriverViews(now time.Time) {
	if p.driver.budget.Share <= 0 {
		return
	}
	for _, over := range p.driver.overBudget(now, p.books.driverAllocs()) {
		p.switchDriverOff(over.PID, over.Why)
	}
}

// switchDriverOff stops tracing process pid's driver calls, reads the
// events sent before, then closes its driver books: what the view held is
// released implicitly, since its frees will not be seen.
func (p *Profiler) switchDriverOff(pid uint32, why string) {
	if err := p.tr.SwitchDriverOff(pid); err != nil {
		logs.Printf(p.cfg.Log, "pid %d: %v", pid, err)
		return
	}
	if err := p.flush(); err != nil {
		logs.Printf(p.cfg.Log, "pid %d: driver view off: %v", pid, err)
		return
	}
	p.books.endDriverView(pid, bpfNow())
	p.driver.switchedOff(pid, why, time.Now())
	logs.Printf(p.cfg.Log, "pid %d: driver view off: %s", pid, why)
}

// overBudget returns the processes whose driver allocations over the last
// window cost more than the budget; allocs are each process's driver
// allocations so far. Processes no longer counted are forgotten.
func (s *driverSwitch) overBudget(now time.Time, allocs map[uint32]uint64) []budget.Over {
	s.mu.Lock()
	defer s.mu.Unlock()
	on := make(map[uint32]uint64, len(allocs))
	for pid, n := range allocs {
		if _, off := s.off[pid]; !off {
			on[pid] = n
		}
	}
	return s.rates.Over(now, on, func(uint32) budget.Budget { return s.budget }, "driver allocation")
}

func (s *driverSwitch) switchedOff(pid uint32, why string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.off[pid] = snapshot.DriverViewOff{PID: pid, Ended: at, Why: why}
	s.exceeded++
	delete(s.rates, pid)
}

// forget drops the views of processes dropped from the books.
func (s *driverSwitch) forget(pids []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pid := range pids {
		delete(s.off, pid)
	}
}

// DriverViewsOff returns the driver views the budget switched off, by PID,
// with the calls each process made since (while it runs).
func (p *Profiler) DriverViewsOff() []snapshot.DriverViewOff {
	p.driver.mu.Lock()
	views := make([]snapshot.DriverViewOff, 0, len(p.driver.off))
	for _, v := range p.driver.off {
		views = append(views, v)
	}
	p.driver.mu.Unlock()
	for i := range views {
		if n, ok := p.tr.DriverCallsOff(views[i].PID); ok {
			views[i].Calls = n
		}
	}
	slices.SortFunc(views, func(a, b snapshot.DriverViewOff) int { return int(a.PID) - int(b.PID) })
	return views
}

// DriverBudgetExceeded counts the driver views the budget switched off.
func (p *Profiler) DriverBudgetExceeded() uint64 {
	p.driver.mu.Lock()
	defer p.driver.mu.Unlock()
	return p.driver.exceeded
}
