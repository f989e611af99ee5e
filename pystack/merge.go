package pystack

import "github.com/gpu-mem/gpu-mem/symbolize"

// evalFunction is the native function that runs Python frames.
const evalFunction = "_PyEval_EvalFrameDefault"

// Merge puts Python frames in place of the interpreter's evaluation frames
// in a native stack; both are innermost first. Each native evaluation frame
// runs the Python frames up to the next entry frame. When the native
// unwinder did not see as many evaluation frames as there are groups of
// Python frames (it stopped early, or libpython lacks frame pointers), the
// stack is the native frames below the first evaluation frame, then every
// Python frame, then the native frames beyond the last evaluation frame.
func Merge(native []symbolize.Frame, py []Frame) []symbolize.Frame {
	if len(py) == 0 {
		return native
	}
	var evals []int
	for i, f := range native {
		if f.Function == evalFunction {
			evals = append(evals, i)
		}
	}
	groups := entryGroups(py)
	out := make([]symbolize.Frame, 0, len(native)+len(py))
	if len(evals) == len(groups) {
		g := 0
		for _, f := range native {
			if f.Function == evalFunction {
				out = appendFrames(out, groups[g])
				g++
				continue
			}
			out = append(out, f)
		}
		return out
	}
	inner := len(native)
	if len(evals) > 0 {
		inner = evals[0]
	}
	out = append(out, native[:inner]...)
	out = appendFrames(out, py)
	if len(evals) > 0 {
		out = append(out, native[evals[len(evals)-1]+1:]...)
	}
	return out
}

// entryGroups splits frames after each entry frame.
func entryGroups(py []Frame) [][]Frame {
	var groups [][]Frame
	start := 0
	for i, f := range py {
		if f.Entry || i == len(py)-1 {
			groups = append(groups, py[start:i+1])
			start = i + 1
		}
	}
	return groups
}

func appendFrames(out []symbolize.Frame, py []Frame) []symbolize.Frame {
	for _, f := range py {
		out = append(out, f.Frame)
	}
	return out
}
