package tests

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/tracer"
)

var simTorch string // the simulated PyTorch allocator, libc10_cuda.so

// startTensors starts simwork.py's tensor scenario under python, with the
// simulated allocator, once gpu-mem has attached to it and walks its frames.
func startTensors(t *testing.T, s *session, python, scenario string, env ...string) *workload {
	t.Helper()
	simTorch = filepath.Join(repoRoot, "build/sim/libc10_cuda.so")
	env = append(env, "SIMCUDA_LIB="+simLib, "SIMTORCH_LIB="+simTorch)
	w := startWorkload(t, env, python, filepath.Join(repoRoot, "tests/workloads/simwork.py"), scenario)
	s.waitLogs(3*time.Second, "PyTorch allocator probes", fmt.Sprintf("pid %d: Python", w.pid))
	return w
}

// byPythonFunction sums a process's rows of one kind by their innermost
// Python frame.
func byPythonFunction(r profiler.Report, pid int, kind tracer.Kind) map[string]profiler.Row {
	rows := map[string]profiler.Row{}
	for _, row := range r.Rows {
		if row.PID != uint32(pid) || row.Kind != kind {
			continue
		}
		py := pythonFrames(row.Frames)
		name := "(no Python frame)"
		if len(py) > 0 {
			name = py[0].Function
		}
		if sum, ok := rows[name]; ok {
			row.Counters.Add(sum.Counters)
		}
		rows[name] = row
	}
	return rows
}

// TestTensorsExact: with PyTorch's caching allocator between the program and
// the driver, the tensor view charges each tensor to the Python function that
// asked for it, and frees release it exactly; the driver view shows the
// segments the allocator holds, under the function whose tensor grew them.
func TestTensorsExact(t *testing.T) {
	for _, python := range pythons(t) {
		t.Run(pythonName(python), func(t *testing.T) {
			s := startProfiler(t, profiler.Config{Library: simLib})
			w := startTensors(t, s, python, "tensors")
			expect := w.run()
			r := s.report()
			const MiB = 1 << 20
			tensors := byPythonFunction(r, w.pid, tracer.KindTensor)
			if tensors["activations"].LiveBytes() != expect["tensor_activations"] {
				t.Errorf("activations live %d, workload holds %d", tensors["activations"].LiveBytes(), expect["tensor_activations"])
			}
			for fn, want := range map[string]accounting.Counters{
				"load_weights": {AllocBytes: expect["tensor_load_weights"], AllocCount: 3},
				"kv_cache":     {AllocBytes: expect["tensor_kv_cache"], AllocCount: 1},
				"activations":  {AllocBytes: 8 * 300032, AllocCount: 8, FreeBytes: 6 * 300032, FreeCount: 6},
			} {
				row := tensors[fn]
				if row.Counters != want || row.Key.Device != 0 {
					t.Errorf("tensors of %s: %+v on device %d, want %+v on 0", fn, row.Counters, row.Key.Device, want)
				}
				delete(tensors, fn)
			}
			if len(tensors) != 0 {
				t.Errorf("tensor rows elsewhere: %v", tensors)
			}
			segments := byPythonFunction(r, w.pid, tracer.KindDevice)
			for fn, want := range map[string]uint64{"load_weights": 20 * MiB, "kv_cache": 12 * MiB, "activations": 4 * MiB} {
				if row := segments[fn]; row.LiveBytes() != want || row.AllocBytes != want || row.Key.Device != 0 {
					t.Errorf("segments of %s: %+v on device %d, want %d live", fn, row.Counters, row.Key.Device, want)
				}
			}
			if r.Python.Missing != 0 {
				t.Errorf("python stats %+v", r.Python)
			}
			assertNoLosses(t, r)
			w.exit()
		})
	}
}
