package profiler

import (
	"slices"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"

	"github.com/gpu-mem/gpu-mem/snapshot"
)

// bareProfiler is a Profiler's parts on a script that sends nothing, its
// jobs started once adjust has changed them.
func bareProfiler(t *testing.T, adjust ...func(*Profiler)) *Profiler {
	p := newProfiler(Config{ProcRoot: "/proc"}, newScript())
	for _, f := range adjust {
		f(p)
	}
	p.startJobs()
	t.Cleanup(func() { p.Close() })
	return p
}

// rawStackOf interns a stack of pid, not named yet.
func rawStackOf(p *Profiler, pid uint32, pc uint64) accounting.StackID {
	return p.stacks.intern(&tracer.Event{PID: pid, Op: memory.Op(1), Stack: []uint64{pc}})
}

// nameStack names a stack function, as resolve would.
func nameStack(p *Profiler, id accounting.StackID, function string) {
	raw := p.stacks.table.m[id].raw
	p.stacks.storeFrames([]accounting.StackID{id}, []*rawStack{raw}, [][]symbolize.Frame{{{Function: function}}})
}

// endInterval is the snapshot of the interval it ends.
func endInterval(t *testing.T, p *Profiler) *snapshot.Snapshot {
	t.Helper()
	s := &snapshot.Snapshot{}
	if err := p.EndInterval(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestIntervalSnapshotLeavesStacksBeingNamed: an interval's snapshot never
// waits for symbols but for its peaks' rows. A row whose stack is still
// being named is left out and the naming asked for; the next snapshot
// after it is named has every byte since; an exited process is not
// dropped before its rows were in a snapshot, and is dropped once that
// one is read.
func TestIntervalSnapshotLeavesStacksBeingNamed(t *testing.T) {
	asked := make(chan struct{}, 8)
	p := bareProfiler(t, func(p *Profiler) { p.stacks.resolving.run = func() { asked <- struct{}{} } })
	setup, load := namedStack(p, 42, "setup", 0x400000), rawStackOf(p, 42, 0x401000)
	held, loaded := accounting.Key{PID: 42, Stack: setup, Kind: memory.KindDevice}, accounting.Key{PID: 42, Stack: load, Kind: memory.KindDevice}
	l, free := p.books.ledger, freeOpOf(t)
	// load's memory is freed before the peaks, which setup's makes: no
	// peak has its row.
	hold := func(ts uint64, k accounting.Key, bytes uint64) {
		l.Alloc(k, 0x1000, memory.SpacePointer, bytes, ts)
		l.Free(42, free, 0x1000, ts+1)
	}
	hold(1, loaded, 100)
	hold(3, held, 1000)
	s := endInterval(t, p)
	if rows := s.Rows(); len(rows) != 1 || rows[0].Key != held {
		t.Fatalf("listed %+v, want setup's alone: load's stack is not named", rows)
	}
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Error("naming not asked for")
	}
	p.DropExited(s)
	hold(5, loaded, 50)
	hold(7, held, 1000)
	p.books.exit(42, 9)
	// Exited before the second snapshot, which leaves its row out again
	// (still being named): kept.
	s = endInterval(t, p)
	p.DropExited(s)
	if rows := s.Rows(); len(rows) != 1 || len(p.stacks.byPID[42]) != 2 {
		t.Fatalf("second snapshot: rows %+v, stacks %v", rows, p.stacks.byPID)
	}

	nameStack(p, load, "load_model")
	// The third has its row.
	s = endInterval(t, p)
	rows := s.Rows()
	want := accounting.Counters{AllocBytes: 150, AllocCount: 2, FreeBytes: 150, FreeCount: 2}
	i := slices.IndexFunc(rows, func(r snapshot.Row) bool { return r.Key == loaded })
	if len(rows) != 2 || i < 0 || rows[i].Counters != want || len(rows[i].Frames) != 2 || rows[i].Frames[1].Function != "load_model" {
		t.Fatalf("rows %+v, want load_model's with %+v", rows, want)
	}
	if n := p.Processes(); n != 1 {
		t.Errorf("%d processes kept before the drop, want 1", n)
	}
	p.DropExited(s)
	if after := endInterval(t, p); after.Len() != 0 || len(p.stacks.byPID) != 0 || len(p.stacks.table.m) != 0 || p.Processes() != 0 || p.stacks.frames.len() != 0 {
		t.Errorf("after the drop: %d rows, stacks %v, %d stacks, %d processes, %d frames", after.Len(), p.stacks.byPID, len(p.stacks.table.m), p.Processes(), p.stacks.frames.len())
	}
	if rows[i].Frames[1].Function != "load_model" {
		t.Errorf("a row listed before the drop now has %+v", rows[i].Frames[1])
	}
}
