package budget

import (
	"slices"
	"testing"
	"time"
)

// TestRatesOver: a process's first measure begins its window; a window
// shorter than the budget's (5 s by default) is not measured; a rate that
// costs exactly the share is within it, one allocation more is over, said
// with the numbers; no share is no budget; a process left out of the
// counts is forgotten, and begins again when counted again.
func TestRatesOver(t *testing.T) {
	r := Rates{}
	shares := map[uint32]float64{7: 0.02, 8: 0}
	budgetOf := func(pid uint32) Budget { return Budget{Share: shares[pid], PairCost: time.Millisecond} }
	t0 := time.Unix(1000, 0)
	if over := r.Over(t0, map[uint32]uint64{7: 10, 8: 10}, budgetOf, "call"); len(over) != 0 {
		t.Fatalf("at the windows' start: %v", over)
	}
	// 100 calls in 5 s at 1 ms: 100 ms of 5 s, 2%: the budget, not over it.
	if over := r.Over(t0.Add(5*time.Second), map[uint32]uint64{7: 110, 8: 1_000_000}, budgetOf, "call"); len(over) != 0 {
		t.Fatalf("at the budget: %v", over)
	}
	if over := r.Over(t0.Add(9*time.Second), map[uint32]uint64{7: 211, 8: 1_000_000}, budgetOf, "call"); len(over) != 0 {
		t.Fatalf("before the window's end: %v", over)
	}
	over := r.Over(t0.Add(10*time.Second), map[uint32]uint64{7: 211, 8: 2_000_000}, budgetOf, "call")
	want := []Over{{7, "over budget: 20 calls a second at 1ms a call cost 2.0% of a thread, more than 2.0%"}}
	if !slices.Equal(over, want) {
		t.Fatalf("one call over: %+v, want %+v", over, want)
	}
	r.Over(t0.Add(11*time.Second), map[uint32]uint64{8: 2_000_000}, budgetOf, "call")
	if _, kept := r[7]; kept || len(r) != 1 {
		t.Fatalf("pid 7 left out: windows %v, want pid 8's alone", r)
	}
	if over := r.Over(t0.Add(20*time.Second), map[uint32]uint64{7: 1_000_000}, budgetOf, "call"); len(over) != 0 {
		t.Fatalf("pid 7 counted again: %v, want its window begun", over)
	}
}
