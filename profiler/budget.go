package profiler

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
	// Window is how long rates are measured over; DefaultBudgetWindow
	// when zero.
	Window time.Duration
}

// DefaultBudgetWindow is what rates are measured over unless told
// otherwise: long enough for a training step's bursts to average out.
const DefaultBudgetWindow = 5 * time.Second

func (b Budget) window() time.Duration {
	if b.Window == 0 {
		return DefaultBudgetWindow
	}
	return b.Window
}

// rateWindow counts a process's allocations over one budget window.
type rateWindow struct {
	start time.Time
	count uint64 // allocations so far when the window began
}

// check measures the window ending now, given the allocations so far, and
// begins the next one; over the budget, it says why, in what's words (a
// noun for one allocation, e.g. "tensor"). The first call only begins.
func (w *rateWindow) check(b Budget, now time.Time, count uint64, what string) (why string, over bool) {
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
