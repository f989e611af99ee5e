// Package budget bounds what a view costs a process: the rate windows over
// which each process's allocations are counted, and the decision that a
// view is over its budget. It is a policy of the profiler, pure: the
// profiler feeds it the allocations counted and the time, and switches off
// what it says is over.
package budget

import (
	"fmt"
	"time"
)

// Budget bounds what a view may cost a process: past it, the view is
// switched off (said once, counted, marked partial in every output).
type Budget struct {
	// Share is the most of a process's time the view may take (0: no
	// budget), its allocating threads counted as one thread's wall time:
	// an upper bound of the share.
	Share float64
	// PairCost is what one allocation and its free cost the thread that
	// makes them with the view on: the traps and the programs
	// (BENCHMARKS.md).
	PairCost time.Duration
	// Window is how long rates are measured over; DefaultWindow when
	// zero.
	Window time.Duration
}

// DefaultWindow is what rates are measured over unless told otherwise:
// long enough for a training step's bursts to average out.
const DefaultWindow = 5 * time.Second

func (b Budget) window() time.Duration {
	if b.Window == 0 {
		return DefaultWindow
	}
	return b.Window
}

// Over is a process over its budget, and why, in words.
type Over struct {
	PID uint32
	Why string
}

// Rates are the rate windows of the processes measured, each counting the
// process's allocations over one budget window.
type Rates map[uint32]*window

type window struct {
	start time.Time
	count uint64 // allocations so far when the window began
}

// Over measures the window ending now of each process of counts (its
// allocations so far) against its budget (budgetOf), begins the next one,
// and returns the processes over their budget, said in what's words (a
// noun for one allocation, e.g. "tensor"). A process's first measure only
// begins its window; the processes not in counts are forgotten.
func (r Rates) Over(now time.Time, counts map[uint32]uint64, budgetOf func(pid uint32) Budget, what string) []Over {
	var over []Over
	for pid, n := range counts {
		w := r[pid]
		if w == nil {
			w = &window{}
			r[pid] = w
		}
		if why, ok := w.check(budgetOf(pid), now, n, what); ok {
			over = append(over, Over{pid, why})
		}
	}
	for pid := range r {
		if _, ok := counts[pid]; !ok {
			delete(r, pid)
		}
	}
	return over
}

// check measures the window ending now, given the allocations so far, and
// begins the next one; over the budget, it says why. The first call only
// begins.
func (w *window) check(b Budget, now time.Time, count uint64, what string) (why string, over bool) {
	if w.start.IsZero() {
		w.start, w.count = now, count
		return "", false
	}
	elapsed := now.Sub(w.start)
	if elapsed < b.window() {
		return "", false
	}
	pairs := count - w.count
	share := (time.Duration(pairs) * b.PairCost).Seconds() / elapsed.Seconds()
	w.start, w.count = now, count
	if b.Share <= 0 || share <= b.Share {
		return "", false
	}
	return fmt.Sprintf("over budget: %.0f %ss a second at %v a %s cost %.1f%% of a thread, more than %.1f%%",
		float64(pairs)/elapsed.Seconds(), what, b.PairCost, what, 100*share, 100*b.Share), true
}
