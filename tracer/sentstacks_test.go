package tracer

import (
	"slices"
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
)

// named is the event the BPF program sends for frames its thread sent
// before: one entry holding their hash and count.
func named(pid uint32, frames []PyFrame) Event {
	return Event{Op: memory.OpTensorAlloc, PID: pid, Flags: pySentBefore | GraphPool,
		PyFrames: []PyFrame{{Code: pyStackHash(frames), Instr: uint64(len(frames))}}}
}

func TestSentStacksNamed(t *testing.T) {
	frames := []PyFrame{{Code: 0x7f0010, Instr: 0x7f0042, Entry: true}, {Code: 0x7f0100, Instr: 0x7f0180}}
	other := []PyFrame{{Code: 0x7f0010, Instr: 0x7f0044, Entry: true}, {Code: 0x7f0100, Instr: 0x7f0180}}
	var s sentStacks
	s.resolve(&Event{Op: memory.OpTensorAlloc, PID: 7, PyFrames: slices.Clone(frames)})
	s.resolve(&Event{Op: memory.OpTensorAlloc, PID: 7, PyFrames: slices.Clone(other)})

	ev := named(7, frames)
	s.resolve(&ev)
	if !slices.Equal(ev.PyFrames, frames) || ev.Flags != GraphPool {
		t.Errorf("named: frames %v flags %#x, want %v and the graph pool's flag alone", ev.PyFrames, ev.Flags, frames)
	}
	ev = named(7, other)
	s.resolve(&ev)
	if !slices.Equal(ev.PyFrames, other) {
		t.Errorf("named: frames %v, want %v", ev.PyFrames, other)
	}
	if s.named != 2 {
		t.Errorf("%d named, want 2", s.named)
	}
}

// TestSentStacksUnknown: frames named but never read (another process's,
// or its process's after its exit) are said broken, not made up.
func TestSentStacksUnknown(t *testing.T) {
	frames := []PyFrame{{Code: 0x7f0010, Instr: 0x7f0042}, {Code: 0x7f0100, Instr: 0x7f0180}}
	var s sentStacks
	s.resolve(&Event{Op: memory.OpTensorAlloc, PID: 7, PyFrames: slices.Clone(frames)})
	s.resolve(&Event{Exit: true, PID: 7})
	for _, pid := range []uint32{7, 8} {
		ev := named(pid, frames)
		s.resolve(&ev)
		if len(ev.PyFrames) != 0 || ev.Flags != PyReadError|GraphPool {
			t.Errorf("pid %d: frames %v flags %#x, want none and a broken chain", pid, ev.PyFrames, ev.Flags)
		}
	}
	if s.named != 0 {
		t.Errorf("%d named, want 0", s.named)
	}
}

// TestPyStackHashDistinguishes: every field of a frame, and their order,
// changes the hash.
func TestPyStackHashDistinguishes(t *testing.T) {
	base := []PyFrame{{Code: 0x7f0010, Instr: 0x7f0042, Class: 0x7e0000}, {Code: 0x7f0100, Instr: 0x7f0180}}
	variants := [][]PyFrame{
		{{Code: 0x7f0018, Instr: 0x7f0042, Class: 0x7e0000}, base[1]},
		{{Code: 0x7f0010, Instr: 0x7f0044, Class: 0x7e0000}, base[1]},
		{{Code: 0x7f0010, Instr: 0x7f0042, Class: 0x7e0008}, base[1]},
		{{Code: 0x7f0010, Instr: 0x7f0042, Class: 0x7e0000, Entry: true}, base[1]},
		{base[1], base[0]},
		base[:1],
	}
	h := pyStackHash(base)
	for _, v := range variants {
		if pyStackHash(v) == h {
			t.Errorf("%v hashes as %v", v, base)
		}
	}
	if h&1 == 0 {
		t.Errorf("hash %#x is even: 0 marks an empty slot", h)
	}
}

// TestSentStacksMalformed: a name without its one entry is said broken.
func TestSentStacksMalformed(t *testing.T) {
	var s sentStacks
	ev := Event{Op: memory.OpTensorAlloc, PID: 7, Flags: pySentBefore}
	s.resolve(&ev)
	if len(ev.PyFrames) != 0 || ev.Flags != PyReadError {
		t.Errorf("frames %v flags %#x, want none and a broken chain", ev.PyFrames, ev.Flags)
	}
}
