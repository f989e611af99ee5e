package profiler

import (
	"testing"

	"github.com/gpu-mem/gpu-mem/symbolize"
)

// TestFrameTableForgetsUnheldFrames: a frame is kept once however many
// stacks hold it, goes with the last of them, and its index is taken
// again; a frame handed out before stays as it was.
func TestFrameTableForgetsUnheldFrames(t *testing.T) {
	table := newFrameTable()
	shared := symbolize.Frame{Function: "forward", File: "model.py", Line: 12}
	a := []uint32{table.intern(shared), table.intern(symbolize.Frame{Function: "layer_1"})}
	b := []uint32{table.intern(shared), table.intern(shared)} // recursion: held twice by one stack
	if a[0] != b[0] || b[0] != b[1] || table.len() != 2 {
		t.Fatalf("indices %v %v, %d frames: want forward once", a, b, table.len())
	}
	kept := table.frames[a[1]]
	table.release(a)
	if table.len() != 1 || table.find(shared) != table.frames[b[0]] {
		t.Fatalf("after the first stack: %d frames, want forward alone", table.len())
	}
	c := table.intern(symbolize.Frame{Function: "layer_2"})
	if c != a[1] {
		t.Errorf("layer_2 at %d, want layer_1's freed index %d", c, a[1])
	}
	if kept.Function != "layer_1" {
		t.Errorf("a frame handed out changed to %+v", kept)
	}
	table.release(b)
	table.release([]uint32{c})
	if table.len() != 0 {
		t.Errorf("%d frames held by no stack", table.len())
	}
	if f := table.find(shared); f.Function != "forward" {
		t.Errorf("find without the frame: %+v", f)
	}
}
