package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// pySites are the allocation sites of simwork.py's sites scenario: the size
// each allocates, and the qualified name of its function as 3.11+ name it
// (co_qualname) and as 3.10 does where it differs. 3.10 has no co_qualname:
// it finds the function in the dicts of its class or module, which a
// function nested in a function is in none of.
var pySites = []struct {
	size          uint64
	name, name310 string
}{
	{1001, "module_function", ""},
	{1002, "Model.method", ""},
	{1003, "Model.class_method", ""},
	{1004, "Model.static_method", ""},
	{1005, "outer.<locals>.inner", "inner"},
	{1006, "Outer.Inner.method", ""},
	{1007, "generate_buffers", ""},
	{1008, "load_async", ""},
	{1011, "thread_one", ""},
	{1012, "thread_two", ""},
	{1013, "thread_three", ""},
	{1014, "thread_four", ""},
	{1020, "recurse", ""},
	{1031, "Loader.Shard.pin", ""},
	{1032, "Loader.Shard.open", ""},
	{1033, "Loader.Shard.size", ""},
	{1034, "Loader.Shard.nbytes", ""},
	{1035, "Base.release", ""},
	{1036, "Base.create", ""},
	{1041, "Layer.__call__", ""},
	{1042, "Layer.__call__", ""},
}

func pythonFrames(frames []*symbolize.Frame) []*symbolize.Frame {
	var py []*symbolize.Frame
	for _, f := range frames {
		if f.File != "" {
			py = append(py, f)
		}
	}
	return py
}

func frameNames(frames []*symbolize.Frame) []string {
	names := make([]string, len(frames))
	for i, f := range frames {
		names[i] = f.Name()
	}
	return names
}

// driverCallLine is the line of simwork.py's call into the driver.
func driverCallLine(t *testing.T) int64 {
	data, err := os.ReadFile(filepath.Join(repoRoot, "tests/workloads/simwork.py"))
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, "# the driver call") {
			return int64(i + 1)
		}
	}
	t.Fatal("no driver call in simwork.py")
	return 0
}

// startPython starts simwork.py, then a profiler of it, and waits until
// the profiler walks its frames.
func startPython(t *testing.T, cfg profiler.Config, python, scenario string) (*session, *workload) {
	t.Helper()
	w := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib}, python, filepath.Join(repoRoot, "tests/workloads/simwork.py"), scenario)
	s := startProfiler(t, cfg, w)
	s.waitEvent(logs.Python, "pid", w.pid)
	return s, w
}

// TestPythonSites: every kind of Python code is named as Python names it,
// with the line of the call, under every interpreter; every allocation event
// has its Python frames.
func TestPythonSites(t *testing.T) {
	driverLine := driverCallLine(t)
	for _, python := range pythons(t) {
		t.Run(pythonName(python), func(t *testing.T) {
			s, w := startPython(t, profiler.Config{Library: simLib}, python, "sites")
			expect := w.run()
			r := s.report()
			is310 := strings.Contains(python, "3.10")

			bySize := map[uint64]snapshot.Row{}
			for _, row := range r.Rows() {
				if row.PID == uint32(w.pid) {
					bySize[row.AllocBytes] = row
				}
			}
			for _, site := range pySites {
				row, ok := bySize[site.size]
				if !ok {
					t.Errorf("no stack allocated %d bytes", site.size)
					continue
				}
				py := pythonFrames(row.Frames)
				if len(py) < 2 {
					t.Errorf("%d bytes: Python frames %v", site.size, frameNames(row.Frames))
					continue
				}
				want := site.name
				if is310 && site.name310 != "" {
					want = site.name310
				}
				if py[0].Function != "cuda_malloc" || py[0].Line != driverLine {
					t.Errorf("%d bytes: innermost %s line %d, want cuda_malloc line %d", site.size, py[0].Function, py[0].Line, driverLine)
				}
				if py[1].Function != want || uint64(py[1].Line) != expect[fmt.Sprintf("line%d", site.size)] {
					t.Errorf("%d bytes: caller %s line %d, want %s line %d", site.size, py[1].Function, py[1].Line, want, expect[fmt.Sprintf("line%d", site.size)])
				}
				if !strings.HasSuffix(py[1].File, "simwork.py") || row.LiveBytes() != site.size {
					t.Errorf("%d bytes: file %s, live %d", site.size, py[1].File, row.LiveBytes())
				}
			}

			// The whole merged stack of one site: the driver, the native
			// frames of the call, then Python from the innermost out.
			names := frameNames(pythonFrames(bySize[1001].Frames))
			if got, want := strings.Join(names, " <- "), "cuda_malloc <- module_function <- sites <- main <- <module>"; got != want {
				t.Errorf("stack %s, want %s", got, want)
			}
			if f := bySize[1001].Frames; f[0].Function != "cuMemAlloc_v2" || f[1].File != "" {
				t.Errorf("native frames of the call not first: %v", frameNames(f))
			}
			// Calls entered from C, each with its shim frame (3.12+): all
			// of them, the first walk's and the second's, which reads
			// them from the C stack's window its first found, and past it
			// one by one (48 calls: simwork's NESTED_CALLS).
			for _, size := range []uint64{1041, 1042} {
				nested := strings.Repeat("Layer.__call__ <- ", 48)
				if got, want := strings.Join(frameNames(pythonFrames(bySize[size].Frames)), " <- "), "cuda_malloc <- "+nested+"sites <- main <- <module>"; got != want {
					t.Errorf("%d bytes: stack %s, want %s", size, got, want)
				}
			}
			// 200-deep recursion: the innermost 128 frames are kept.
			deep := pythonFrames(bySize[1020].Frames)
			if len(deep) != 128 || deep[127].Function != "recurse" {
				t.Errorf("recursion kept %d frames, outermost %v", len(deep), deep[len(deep)-1])
			}

			want := snapshot.PythonStats{Processes: 1, Events: uint64(len(pySites)), Truncated: 1}
			if r.Python != want {
				t.Errorf("python stats %+v, want %+v", r.Python, want)
			}
			assertNoLosses(t, r)
			w.exit()
		})
	}
}

func pythonName(path string) string {
	return filepath.Base(filepath.Dir(filepath.Dir(path))) + "-" + filepath.Base(path)
}

// TestPythonInEveryOutput: pprof carries Python functions with their file and
// line, folded and top name them.
func TestPythonInEveryOutput(t *testing.T) {
	python := "/root/.pyenv/versions/3.12.1/bin/python3.12"
	dir := t.TempDir()
	outputs := map[string]string{}
	for _, format := range []string{"pprof", "folded"} {
		outputs[format] = filepath.Join(dir, "out."+format)
		w := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib}, python, filepath.Join(repoRoot, "tests/workloads/simwork.py"), "sites")
		c := startCLI(t, "record", "--pid", strconv.Itoa(w.pid), "--format", format, "-o", outputs[format])
		c.waitEvent(logs.Python, "version", "3.12")
		c.waitEvent(logs.Attached, "kind", "driver")
		expect := w.run()
		c.interrupt()
		w.exit()
		outputs["line"] = strconv.FormatUint(expect["line1002"], 10)
	}

	p := readProfile(t, outputs["pprof"])
	found := false
	for _, s := range p.Sample {
		for _, loc := range s.Location {
			l := loc.Line[0]
			if l.Function.Name == "Model.method" {
				found = strconv.FormatInt(l.Line, 10) == outputs["line"] && strings.HasSuffix(l.Function.Filename, "simwork.py") && s.Value[3] == 1002
			}
		}
	}
	if !found {
		t.Errorf("pprof has no Model.method at simwork.py:%s with 1002 bytes in use", outputs["line"])
	}

	folded, err := os.ReadFile(outputs["folded"])
	if err != nil {
		t.Fatal(err)
	}
	if !matchLine(string(folded), `^python3.12;gpu=0;.*<module>;main;sites;Model.method;cuda_malloc;.*cuMemAlloc_v2 1002$`) {
		t.Errorf("folded:\n%s", folded)
	}

	w := startWorkload(t, []string{"SIMCUDA_LIB=" + simLib}, python, filepath.Join(repoRoot, "tests/workloads/simwork.py"), "model")
	c := startCLI(t, "top", "--pid", strconv.Itoa(w.pid), "--interval", "200ms")
	c.waitEvent(logs.Python, "version", "3.12")
	c.waitEvent(logs.Attached, "kind", "driver")
	w.run()
	c.waitStdout(strconv.Itoa(w.pid) + ` +python3.12 +- +device +0 .* cuda_malloc$`)
	c.interrupt()
	w.exit()
}
