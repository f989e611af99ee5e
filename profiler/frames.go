package profiler

import "github.com/gpu-mem/gpu-mem/symbolize"

// frameTable holds each distinct frame of the named stacks once: stacks
// share most of their frames, and 100,000 stacks would otherwise hold a
// copy each. Stacks hold indices rather than pointers: half the size, and
// nothing for the garbage collector to follow. A snapshot reads them
// through its own copy of the table's pointers (appendPointers).
//
// A frame is counted once per place a stack holds it, and goes with the
// last: a node's agent sees new frames for as long as it runs (each job's
// own functions, files and lines), and keeps only those of the processes
// it still reports. Freed indices are taken again; a report keeps the
// frames it was given, which are never changed.
type frameTable struct {
	frames []*symbolize.Frame // nil where free
	refs   []uint32
	index  map[symbolize.Frame]uint32
	free   []uint32
}

func newFrameTable() frameTable { return frameTable{index: map[symbolize.Frame]uint32{}} }

// intern returns the index of f, taking a reference on it.
func (t *frameTable) intern(f symbolize.Frame) uint32 {
	i, ok := t.index[f]
	if !ok {
		copied := f // on the heap only when new
		if n := len(t.free); n > 0 {
			i, t.free = t.free[n-1], t.free[:n-1]
			t.frames[i], t.refs[i] = &copied, 0
		} else {
			i = uint32(len(t.frames))
			t.frames = append(t.frames, &copied)
			t.refs = append(t.refs, 0)
		}
		t.index[f] = i
	}
	t.refs[i]++
	return i
}

// release drops a reference on each index, as intern took them; a frame
// with none left is forgotten.
func (t *frameTable) release(indices []uint32) {
	for _, i := range indices {
		if t.refs[i]--; t.refs[i] == 0 {
			delete(t.index, *t.frames[i])
			t.frames[i] = nil
			t.free = append(t.free, i)
		}
	}
}

// find returns the frame equal to f if the table holds one, else a copy
// of f: for a stack listed before it is named, which takes no reference.
func (t *frameTable) find(f symbolize.Frame) *symbolize.Frame {
	if i, ok := t.index[f]; ok {
		return t.frames[i]
	}
	return &f
}

// appendPointers appends the table's frames, by index, to dst: a copy that
// an index freed and taken again afterwards does not change.
func (t *frameTable) appendPointers(dst []*symbolize.Frame) []*symbolize.Frame {
	return append(dst, t.frames...)
}

// len is how many frames the table holds.
func (t *frameTable) len() int { return len(t.index) }
