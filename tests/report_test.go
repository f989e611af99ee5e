package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// rowsText are rows as text: frames, process name and counts, sorted; the
// same in two profilers (whose stack IDs differ).
func rowsText(rows []snapshot.Row) []string {
	var out []string
	for _, row := range rows {
		var names []string
		for _, f := range row.Frames {
			names = append(names, f.Name())
		}
		out = append(out, fmt.Sprintf("%s %s %s %+v", strings.Join(names, ";"), row.Comm, row.Kind, row.Counters))
	}
	slices.Sort(out)
	return out
}

// TestSnapshotToReusesRows: a snapshot taken again in place, and an
// interval snapshot (as the agent takes every interval, by another
// profiler of the same processes), say what a new report says, as the
// rows grow and as they shrink when a process's rows are dropped (after
// its exit, as the second snapshot begins).
func TestSnapshotToReusesRows(t *testing.T) {
	many := startWorkload(t, nil, simwork, "stacks", "300")
	few := startWorkload(t, nil, simwork, "kinds")
	s := startProfiler(t, profiler.Config{Library: simLib}, many, few)
	agent := startProfiler(t, profiler.Config{Library: simLib}, many, few)

	var reused, interval snapshot.Snapshot
	check := func(what string, wantRows int) {
		t.Helper()
		for _, s := range []*session{s, agent} {
			if err := s.p.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.p.SnapshotTo(&reused); err != nil {
			t.Fatal(err)
		}
		want := rowsText(s.report().Rows())
		if reused.Len() != wantRows && wantRows >= 0 {
			t.Errorf("%s: %d rows, want %d", what, reused.Len(), wantRows)
		}
		if got := rowsText(reused.Rows()); !slices.Equal(got, want) {
			t.Errorf("%s: %d rows reused, %d in a new report, or they differ", what, len(got), len(want))
		}
		// A whole snapshot names every stack first: the interval snapshot
		// leaves none out for its naming.
		if _, err := agent.p.Snapshot(); err != nil {
			t.Fatal(err)
		}
		if err := agent.p.EndInterval(&interval); err != nil {
			t.Fatal(err)
		}
		if got := rowsText(interval.Rows()); !slices.Equal(got, want) {
			t.Errorf("%s: %d rows in an interval snapshot, %d in a report, or they differ", what, len(got), len(want))
		}
	}

	few.run()
	check("few", -1)
	kinds := reused.Len()
	many.run()
	check("many", -1)
	if reused.Len() < kinds+300 {
		t.Errorf("%d rows, want at least %d", reused.Len(), kinds+300)
	}
	many.exit()
	// The first snapshot after the exit has the process's rows; the
	// process is dropped once it is read.
	for _, s := range []*session{s, agent} {
		if err := s.p.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.p.Snapshot()
	if err != nil || first.Len() < kinds+300 {
		t.Errorf("the first snapshot after the exit: %d rows, want at least %d (%v)", first.Len(), kinds+300, err)
	}
	s.p.DropExited(first)
	firstInterval := &snapshot.Snapshot{}
	if err := agent.p.EndInterval(firstInterval); err != nil || firstInterval.Len() < kinds+300 {
		t.Errorf("the first interval after the exit: %d rows, want at least %d (%v)", firstInterval.Len(), kinds+300, err)
	}
	agent.p.DropExited(firstInterval)
	check("after the exit", kinds)
}
