package profiler

import (
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// bareProfiler is a Profiler's books without a tracer.
func bareProfiler() *Profiler {
	return &Profiler{
		sym:        symbolize.New("/proc"),
		ledger:     accounting.New(),
		stacks:     newStackTable(),
		pidStacks:  map[uint32][]accounting.StackID{},
		resolveNow: make(chan struct{}, 1),
		comms:      map[uint32]string{},
		frameTable: newFrameTable(),
		exitedAt:   map[uint32]uint64{},
	}
}

func listRows(p *Profiler) []Row {
	var rows []Row
	p.EachRow(func(r *Row) {
		row := *r
		row.Frames = append([]*symbolize.Frame(nil), r.Frames...)
		rows = append(rows, row)
	})
	return rows
}

// TestEachRowLeavesStacksBeingNamed: a listing never waits for symbols. A
// row whose stack is still being named is left out and the naming asked
// for; the next listing after it is named has every byte since; an exited
// process is not dropped before its rows were listed, and is dropped as
// the listing after that one begins.
func TestEachRowLeavesStacksBeingNamed(t *testing.T) {
	p := bareProfiler()
	ev := &tracer.Event{PID: 42, Op: memory.Op(1), Stack: []uint64{0x401000}}
	raw := &rawStack{key: string(stackKey(nil, ev)), op: ev.Op}
	id, check, _ := p.stacks.lookup([]byte(raw.key))
	p.stacks.add(id, check, raw)
	p.pidStacks[42] = []accounting.StackID{id}
	key := accounting.Key{PID: 42, Stack: id, Kind: memory.KindDevice}
	p.ledger.Alloc(key, 0x1000, memory.SpacePointer, 100, 1)

	if rows := listRows(p); len(rows) != 0 {
		t.Fatalf("listed %+v before its stack was named", rows)
	}
	select {
	case <-p.resolveNow:
	default:
		t.Error("naming not asked for")
	}
	p.ledger.Alloc(key, 0x2000, memory.SpacePointer, 50, 2)
	p.ledger.Exit(42, 3)
	p.exited(42)
	// Exited after the first listing began: kept by the second, which
	// leaves its rows out again (still being named).
	if rows := listRows(p); len(rows) != 0 || len(p.pidStacks[42]) != 1 {
		t.Fatalf("second listing: rows %+v, stacks %v", rows, p.pidStacks)
	}

	p.storeFrames([]accounting.StackID{id}, []*rawStack{raw}, [][]symbolize.Frame{{{Function: "load_model"}}})
	// Exited before the second listing began, but that one left its rows
	// out: the third lists them.
	rows := listRows(p)
	want := accounting.Counters{AllocBytes: 150, AllocCount: 2, ImplicitFreeBytes: 150, ImplicitFreeCount: 2}
	if len(rows) != 1 || rows[0].Counters != want || len(rows[0].Frames) != 2 || rows[0].Frames[1].Function != "load_model" {
		t.Fatalf("rows %+v, want one of %+v from load_model", rows, want)
	}
	if n := p.Processes(); n != 1 {
		t.Errorf("%d processes kept before the drop, want 1", n)
	}
	if rows := listRows(p); len(rows) != 0 || len(p.pidStacks) != 0 || len(p.stacks.m) != 0 || p.Processes() != 0 || p.frameTable.len() != 0 {
		t.Errorf("after the drop: rows %+v, stacks %v, %d stacks, %d processes, %d frames", rows, p.pidStacks, len(p.stacks.m), p.Processes(), p.frameTable.len())
	}
	if rows[0].Frames[1].Function != "load_model" {
		t.Errorf("a row listed before the drop now has %+v", rows[0].Frames[1])
	}
}
