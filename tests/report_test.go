package tests

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/profiler"
)

// rowsByKey are a report's rows as text: frames, process name and counts.
func rowsByKey(r profiler.Report) map[accounting.Key]string {
	rows := map[accounting.Key]string{}
	for _, row := range r.Rows {
		var names []string
		for _, f := range row.Frames {
			names = append(names, f.Name())
		}
		rows[row.Key] = fmt.Sprintf("%s %s %+v", strings.Join(names, ";"), row.Comm, row.Counters)
	}
	return rows
}

// TestReportToReusesRows: a report filled again in place, and the rows
// read one by one (EachRow, as the agent's exporter does every interval),
// say what a new report says, as the rows grow and as they shrink when a
// process's rows are dropped (after its exit, as the second report begins).
func TestReportToReusesRows(t *testing.T) {
	many := startWorkload(t, nil, simwork, "stacks", "300")
	few := startWorkload(t, nil, simwork, "kinds")
	s := startProfiler(t, profiler.Config{Library: simLib}, many, few)

	var reused profiler.Report
	check := func(what string, wantRows int) {
		t.Helper()
		if err := s.p.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := s.p.ReportTo(&reused); err != nil {
			t.Fatal(err)
		}
		fresh := s.report()
		got, want := rowsByKey(reused), rowsByKey(fresh)
		if len(reused.Rows) != wantRows && wantRows >= 0 {
			t.Errorf("%s: %d rows, want %d", what, len(reused.Rows), wantRows)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d rows reused, %d in a new report", what, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: row %+v reused: %s, new: %s", what, k, got[k], v)
			}
		}
		// Rows one by one, as the agent's exporter reads them.
		var each profiler.Report
		s.p.EachRow(func(row *profiler.Row) {
			copied := *row
			copied.Frames = slices.Clone(row.Frames)
			each.Rows = append(each.Rows, copied)
		})
		if got := rowsByKey(each); !maps.Equal(got, want) {
			t.Errorf("%s: %d rows one by one, %d in a report, or they differ", what, len(got), len(want))
		}
	}

	few.run()
	check("few", -1)
	kinds := len(reused.Rows)
	many.run()
	check("many", -1)
	if len(reused.Rows) < kinds+300 {
		t.Errorf("%d rows, want at least %d", len(reused.Rows), kinds+300)
	}
	many.exit()
	// The first report begun after the exit has the process's rows; the
	// process is dropped as the next begins.
	if n := len(s.report().Rows); n < kinds+300 {
		t.Errorf("the first report after the exit: %d rows, want at least %d", n, kinds+300)
	}
	check("after the exit", kinds)
}
