package profiler

import (
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/tracer"

	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestPIDTakenAgain: a process exits and a new one takes its PID before
// the first is dropped. The new process is not dropped with the old one
// while it lives: its rows keep their frames and it has its own name,
// read again; once it exits, both go. Each read of rowsOf42 but the
// first is followed by a drop, as the agent's loop does.
func TestPIDTakenAgain(t *testing.T) {
	p := bareProfiler(t, func(p *Profiler) { p.procs.reading.run = func() {} }) // processes noted, left to read
	event := func(ev tracer.Event) {
		ev.PID, ev.TID, ev.Op, ev.Bytes = 42, 42, memory.Op(1), 100
		p.handle(&ev)
	}
	var last *snapshot.Snapshot
	rowsOf42 := func() []snapshot.Row {
		t.Helper()
		if last != nil {
			p.DropExited(last)
		}
		last = endInterval(t, p)
		var rows []snapshot.Row
		for _, r := range last.Rows() {
			if r.PID == 42 {
				rows = append(rows, r)
			}
		}
		return rows
	}
	event(tracer.Event{Comm: "old", Address: 0x1000, Timestamp: 1, Stack: []uint64{0x401000}})
	event(tracer.Event{Exit: true, Timestamp: 2})
	if rows := rowsOf42(); len(rows) != 1 || rows[0].Comm != "old" {
		t.Fatalf("the first process: %+v", rows)
	}
	event(tracer.Event{Comm: "new", Address: 0x2000, Timestamp: 3, Stack: []uint64{0x402000}})
	if !p.procs.pids[42].renewed {
		t.Error("the new process is not read again")
	}
	for i := range 3 { // the old one would be dropped at the second
		rows := rowsOf42()
		var live uint64
		for _, r := range rows {
			live += r.LiveBytes()
			if r.Comm != "new" || len(r.Frames) == 0 {
				t.Errorf("interval %d: row %+v", i, r)
			}
		}
		if live != 100 || p.Processes() != 1 {
			t.Fatalf("interval %d: %d bytes live in %d rows, %d processes: want the new one's 100", i, live, len(rows), p.Processes())
		}
	}
	event(tracer.Event{Exit: true, Timestamp: 4})
	rowsOf42()
	rowsOf42()
	if n := p.Processes(); n != 0 {
		t.Errorf("%d processes after both exited", n)
	}
}

// TestDroppedAnIntervalLater: dropping by the interval before (the agent's
// DropExitedBy) keeps a process that exited one whole interval after the
// one that read its exit: /metrics shows its implicit frees through it,
// whenever in its interval the exit came.
func TestDroppedAnIntervalLater(t *testing.T) {
	p := bareProfiler(t, func(p *Profiler) { p.procs.reading.run = func() {} })
	p.handle(&tracer.Event{PID: 42, Op: memory.OpMemAlloc, Bytes: 100, Address: 0x1000, Timestamp: 1, Stack: []uint64{0x401000}})
	p.handle(&tracer.Event{PID: 42, Exit: true, Timestamp: 2})
	var before uint64                  // the interval before's Exits
	for i, want := range []int{1, 0} { // DropExited would drop it at the first
		s := endInterval(t, p)
		p.DropExitedBy(before, s)
		before = s.Exits
		if n := p.Processes(); n != want {
			t.Fatalf("after interval %d: %d processes, want %d", i, n, want)
		}
	}
}
