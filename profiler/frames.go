package profiler

import "github.com/gpu-mem/gpu-mem/symbolize"

// frameTable holds each distinct frame of the named stacks once: stacks
// share most of their frames, and 100,000 stacks would otherwise hold a
// copy each. A named stack holds pointers into the table, which snapshots
// and reports share: a frame, once interned, is never changed.
//
// A frame is counted once per place a stack holds it, and goes with the
// last: a node's agent sees new frames for as long as it runs (each job's
// own functions, files and lines), and keeps only those of the processes
// it still reports. A snapshot that holds a forgotten frame keeps it
// alive, unchanged, until it is let go.
type frameTable struct {
	index map[symbolize.Frame]*heldFrame
}

// heldFrame is a frame and how many places of stacks hold it.
type heldFrame struct {
	symbolize.Frame
	refs uint32
}

func newFrameTable() frameTable { return frameTable{index: map[symbolize.Frame]*heldFrame{}} }

// intern returns the table's copy of f, taking a reference on it.
func (t *frameTable) intern(f symbolize.Frame) *symbolize.Frame {
	h, ok := t.index[f]
	if !ok {
		h = &heldFrame{Frame: f}
		t.index[f] = h
	}
	h.refs++
	return &h.Frame
}

// release drops a reference on each frame, as intern took them; a frame
// with none left is forgotten.
func (t *frameTable) release(frames []*symbolize.Frame) {
	for _, f := range frames {
		h := t.index[*f]
		if h.refs--; h.refs == 0 {
			delete(t.index, *f)
		}
	}
}

// find returns the frame equal to f if the table holds one, else a copy
// of f: for a stack listed before it is named, which takes no reference.
func (t *frameTable) find(f symbolize.Frame) *symbolize.Frame {
	if h, ok := t.index[f]; ok {
		return &h.Frame
	}
	return &f
}

// len is how many frames the table holds.
func (t *frameTable) len() int { return len(t.index) }
