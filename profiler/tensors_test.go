package profiler

import (
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestTensorBudgetTripsAtItsRate: a view whose tensors cost exactly the
// budget's share stays on; one tensor more a window switches it off, said
// with the numbers.
func TestTensorBudgetTripsAtItsRate(t *testing.T) {
	s := newTensorSwitch(Budget{Share: 0.02, PairCost: 2 * time.Microsecond, Window: 5 * time.Second})
	t0 := time.Unix(1000, 0)
	s.views[7] = &tensorView{TensorView: snapshot.TensorView{PID: 7, Since: t0}}
	s.views[8] = &tensorView{TensorView: snapshot.TensorView{PID: 8}} // waiting for its allocator: not measured
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
	if len(over) != 1 || over[0].pid != 7 || over[0].why != want {
		t.Fatalf("one tensor over: %+v, want pid 7: %q", over, want)
	}
}
