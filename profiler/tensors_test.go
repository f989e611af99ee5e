package profiler

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/budget"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestTensorBudgetTripsAtItsRate: a view whose tensors cost exactly the
// budget's share stays on; one tensor more a window switches it off, said
// with the numbers.
func TestTensorBudgetTripsAtItsRate(t *testing.T) {
	s := newTensorSwitch(budget.Budget{Share: 0.02, PairCost: 2 * time.Microsecond, Window: 5 * time.Second})
	t0 := time.Unix(1000, 0)
	s.set(7, snapshot.TensorAsk{By: snapshot.ByFlag}, t0)
	s.views[7].Since = t0
	s.set(8, snapshot.TensorAsk{By: snapshot.ByFlag}, t0) // waiting for its allocator: not measured
	if over := s.overBudget(t0, map[uint32]uint64{7: 100, 8: 1 << 40}); len(over) != 0 {
		t.Fatalf("at the window's start: %v", over)
	}
	// 50,000 tensors in 5 s at 2 us: 100 ms of 5 s, 2%: the budget, not over it.
	if over := s.overBudget(t0.Add(5*time.Second), map[uint32]uint64{7: 100 + 50_000}); len(over) != 0 {
		t.Fatalf("at the budget: %v", over)
	}
	if over := s.overBudget(t0.Add(9*time.Second), map[uint32]uint64{7: 100 + 100_001}); len(over) != 0 {
		t.Fatalf("before the window's end: %v", over)
	}
	over := s.overBudget(t0.Add(10*time.Second), map[uint32]uint64{7: 100 + 100_001})
	want := "over budget: 10000 tensors a second at 2µs a tensor cost 2.0% of a thread, more than 2.0%"
	if len(over) != 1 || over[0].PID != 7 || over[0].Why != want {
		t.Fatalf("one tensor over: %+v, want pid 7: %q", over, want)
	}
}

// TestTensorViewsOwnBudget: a view asked with a budget of its own is held
// to it, not to the agent's: a share above the agent's keeps it on at a
// rate that ends the others, no budget (0) never ends it; asked again, a
// view on takes the new budget.
func TestTensorViewsOwnBudget(t *testing.T) {
	s := newTensorSwitch(budget.Budget{Share: 0.02, PairCost: 2 * time.Microsecond, Window: 5 * time.Second})
	t0 := time.Unix(1000, 0)
	half, none := 0.5, 0.0
	for pid, budget := range map[uint32]*float64{7: &half, 8: nil, 9: &none, 10: nil} {
		s.set(pid, snapshot.TensorAsk{By: snapshot.ByControl, Budget: budget}, t0)
		s.views[pid].Since = t0
	}
	s.set(10, snapshot.TensorAsk{By: snapshot.ByControl, Budget: &half}, t0) // asked again
	for pid, want := range map[uint32]float64{7: 0.5, 8: 0.02, 9: 0, 10: 0.5} {
		if got := s.views[pid].Budget; got != want {
			t.Errorf("pid %d's view: budget %v, want %v", pid, got, want)
		}
	}
	s.overBudget(t0, map[uint32]uint64{})
	// 1,250,001 tensors in 5 s at 2 us: 50% of a thread and one tensor more.
	n := uint64(1_250_001)
	over := s.overBudget(t0.Add(5*time.Second), map[uint32]uint64{7: n, 8: n, 9: n, 10: 1_250_000})
	want := "over budget: 250000 tensors a second at 2µs a tensor cost 50.0% of a thread, more than 2.0%"
	if len(over) != 2 {
		t.Fatalf("over budget: %+v, want pids 7 and 8", over)
	}
	slices.SortFunc(over, func(a, b budget.Over) int { return int(a.PID) - int(b.PID) })
	if over[0].PID != 7 || !strings.HasSuffix(over[0].Why, "more than 50.0%") || over[1].PID != 8 || over[1].Why != want {
		t.Errorf("over budget: %+v; want pid 7 over its 50%%, pid 8 %q", over, want)
	}
}

// TestPodAskAfterTheBudget: a pod's view that its budget switched off
// stays off while the pod asks the same, and is switched on again when
// the pod asks otherwise; a view on takes a pod's new end or budget.
func TestPodAskAfterTheBudget(t *testing.T) {
	s := newTensorSwitch(budget.Budget{Share: 0.02, PairCost: 2 * time.Microsecond})
	t0 := time.Unix(1000, 0)
	ask := snapshot.TensorAsk{By: snapshot.ByAnnotation}
	if got := s.answer(7, ask); got != askNew {
		t.Fatalf("no view: %v, want askNew", got)
	}
	s.set(7, ask, t0)
	if got := s.answer(7, ask); got != askHeld {
		t.Errorf("on as asked: %v, want askHeld", got)
	}
	later := snapshot.TensorAsk{By: snapshot.ByAnnotation, Until: t0.Add(time.Hour)}
	if got := s.answer(7, later); got != askChanged {
		t.Errorf("on, asked with an end: %v, want askChanged", got)
	}
	s.end(7, "over budget: x", true)
	if got := s.answer(7, ask); got != askHeld {
		t.Errorf("ended by its budget, asked the same: %v, want askHeld", got)
	}
	quarter := 0.25
	if got := s.answer(7, snapshot.TensorAsk{By: snapshot.ByAnnotation, Budget: &quarter}); got != askNew {
		t.Errorf("ended by its budget, asked with another: %v, want askNew", got)
	}
	s.set(8, snapshot.TensorAsk{By: snapshot.ByControl}, t0)
	if got := s.answer(8, ask); got != askHeld {
		t.Errorf("on by the control socket: %v, want askHeld", got)
	}
	s.end(8, "switched off", false)
	if got := s.answer(8, ask); got != askNew {
		t.Errorf("switched off by the control socket: %v, want askNew", got)
	}
}
