package pystack

import (
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/symbolize"
)

func native(names ...string) []symbolize.Frame {
	frames := make([]symbolize.Frame, len(names))
	for i, n := range names {
		frames[i] = symbolize.Frame{Function: n}
	}
	return frames
}

func python(names ...string) []Frame {
	frames := make([]Frame, len(names))
	for i, n := range names {
		frames[i] = Frame{Frame: symbolize.Frame{Function: strings.TrimSuffix(n, "!"), File: "x.py"}, Entry: strings.HasSuffix(n, "!")}
	}
	return frames
}

func names(frames []symbolize.Frame) string {
	var s []string
	for _, f := range frames {
		s = append(s, f.Function)
	}
	return strings.Join(s, " ")
}

func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		native []symbolize.Frame
		py     []Frame
		want   string
	}{
		{
			"each evaluation frame replaced by its Python frames",
			native("ffi_call", "_PyEval_EvalFrameDefault", "PyObject_Call", "map_next", "_PyEval_EvalFrameDefault", "Py_RunMain", "main"),
			python("cuda_malloc", "alloc!", "run", "<module>!"),
			"ffi_call cuda_malloc alloc PyObject_Call map_next run <module> Py_RunMain main",
		},
		{
			"unwinder stopped before the interpreter",
			native("ffi_call", "libffi+0x10"),
			python("cuda_malloc", "alloc!", "<module>!"),
			"ffi_call libffi+0x10 cuda_malloc alloc <module>",
		},
		{
			"fewer evaluation frames than groups",
			native("ffi_call", "_PyEval_EvalFrameDefault", "Py_RunMain"),
			python("a!", "b!"),
			"ffi_call a b Py_RunMain",
		},
		{
			"no Python frames",
			native("alloc", "main"),
			nil,
			"alloc main",
		},
	} {
		if got := names(Merge(tc.native, tc.py)); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}
