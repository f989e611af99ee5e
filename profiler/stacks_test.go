package profiler

import (
	"hash/maphash"
	"testing"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/tracer"
)

func TestStackKeyReadsBack(t *testing.T) {
	ev := &tracer.Event{PID: 4242, Op: memory.Op(3), Stack: []uint64{0x401000, 0x7f0000123456}, PyFrames: []tracer.PyFrame{{Code: 1, Instr: 2}}}
	raw := rawStack{key: string(stackKey(nil, ev))}
	if raw.pid() != 4242 {
		t.Errorf("pid %d", raw.pid())
	}
	if got := raw.native(); len(got) != 2 || got[0] != 0x401000 || got[1] != 0x7f0000123456 {
		t.Errorf("native %#x", got)
	}
	if got := raw.pyFrames(); len(got) != 1 || got[0] != ev.PyFrames[0] {
		t.Errorf("Python frames %+v", got)
	}
	other := *ev
	other.PyFrames = []tracer.PyFrame{{Code: 1, Instr: 3}}
	if string(stackKey(nil, &other)) == raw.key {
		t.Error("stacks that differ in a Python frame have one key")
	}
}

// collidingTable hashes every key to the same ID, and the checks of keys
// of one length alike: the worst case of stackTable's hashes.
func collidingTable() stackTable {
	t := newStackTable()
	t.hash = func(seed maphash.Seed, key []byte) uint64 {
		if seed == t.seeds[0] {
			return 1 << 40
		}
		return uint64(len(key))
	}
	return t
}

func intern(t *stackTable, key string) accounting.StackID {
	id, check, found := t.lookup([]byte(key))
	if !found {
		t.add(id, check, &rawStack{key: key})
	}
	return id
}

// name drops a stack's raw key, as resolve does.
func name(t *stackTable, id accounting.StackID) {
	s := t.m[id]
	s.raw, s.frames = nil, []uint32{0}
	t.m[id] = s
}

func TestStackTableCollisions(t *testing.T) {
	table := collidingTable()
	a, b, c := intern(&table, "aaaa"), intern(&table, "bbbb"), intern(&table, "cc")
	if a == b || b == c || a == c {
		t.Fatalf("IDs %d %d %d: distinct stacks share one", a, b, c)
	}
	// While raw keys are kept, the same check (same length) is told apart
	// by the key; once named, by the check alone.
	if intern(&table, "aaaa") != a || intern(&table, "bbbb") != b || intern(&table, "cc") != c {
		t.Fatal("a stack seen again got another ID")
	}
	name(&table, c)
	if intern(&table, "cc") != c {
		t.Fatal("a named stack seen again got another ID")
	}

	// Dropping the first of a run keeps the others found.
	table.drop(a)
	if intern(&table, "bbbb") != b || intern(&table, "cc") != c {
		t.Fatal("after a drop, a colliding stack got another ID")
	}
	table.drop(c)
	table.drop(b)
	if len(table.m) != 0 {
		t.Errorf("after dropping every stack, %d entries stay", len(table.m))
	}
}

func TestStackTableSkipsZero(t *testing.T) {
	table := newStackTable()
	table.hash = func(maphash.Seed, []byte) uint64 { return 0 }
	if id := intern(&table, "x"); id == 0 {
		t.Error("a stack got ID 0, the sum over stacks")
	}
}
