package main

import (
	"testing"
	"time"
)

// TestPushedForTellsReusedIDsApart: two processes given one ID at
// different times each get the intervals that end while they are the
// one with it.
func TestPushedForTellsReusedIDsApart(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) int64 { return t0.Add(time.Duration(s) * time.Second).UnixNano() }
	tally := newPushTally()
	tally.pids[42] = map[int64]*pushed{
		at(15): {allocs: 3, allocBytes: 300, inuse: 100},
		at(30): {allocs: 1, allocBytes: 10, inuse: 0},  // the first exited
		at(60): {allocs: 7, allocBytes: 700, inuse: 0}, // the second's
	}
	first, live, found := tally.pushedFor(42, t0, t0.Add(40*time.Second))
	if !found || first.allocs != 4 || first.allocBytes != 310 || live != 0 {
		t.Errorf("first: %+v, live %d", first, live)
	}
	second, live, found := tally.pushedFor(42, t0.Add(40*time.Second), time.Time{})
	if !found || second.allocs != 7 || second.allocBytes != 700 || live != 0 {
		t.Errorf("second: %+v, live %d", second, live)
	}
	if _, _, found := tally.pushedFor(7, t0, time.Time{}); found {
		t.Error("intervals for an ID never pushed")
	}
}
