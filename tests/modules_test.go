package tests

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// startOwnDriver starts a profiler on a copy of the simulated driver that
// no other test's process maps, with the simulated NVML's contexts of
// ctxBytes; it returns the profiler and the workloads' environment.
func startOwnDriver(t *testing.T, ctxBytes uint64) (*session, []string) {
	t.Helper()
	env := nvmlState(t, ctxBytes)
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	copyFile(t, simLib, lib)
	s := startProfiler(t, profiler.Config{Library: lib, NVML: simNVML()})
	s.waitLog("attached to " + lib)
	return s, append(env, "LD_LIBRARY_PATH="+dir)
}

// processRows are pid's rows, each "kind gpu bytes first-frame", sorted;
// want names a function each row of kind module must have in its stack.
func processRows(t *testing.T, r *snapshot.Snapshot, pid int, want map[string]string) []string {
	t.Helper()
	var got []string
	for _, row := range r.Rows() {
		if row.PID != uint32(pid) {
			continue
		}
		first := row.Frames[0].Name()
		got = append(got, fmt.Sprintf("%s gpu %s %d %s", row.Kind, row.GPU(), row.LiveBytes(), first))
		if fn, ok := want[first]; ok && !slices.ContainsFunc(row.Frames, func(f *symbolize.Frame) bool { return f.Function == fn }) {
			t.Errorf("%s's stack %v, want %s in it", first, rowsText([]snapshot.Row{row}), fn)
		}
	}
	slices.Sort(got)
	return got
}

// TestModuleChargedToItsStack: with eager loading (the simulated driver's),
// a module's kernel images (NVML's growth across cuModuleLoadData, 3 MiB)
// are charged to the stack that loaded it (load_kernels), and a library's
// (cuLibraryLoadData, 5 MiB) to load_library's, each its own row of kind
// module, not the driver's internals (0 while NVML says 7 MiB of context
// + 3 MiB + 5 MiB); an unload ends its row, NVML giving its bytes back,
// the driver's internals still 0. The view says the modules' part.
func TestModuleChargedToItsStack(t *testing.T) {
	s, env := startOwnDriver(t, 7*MiB)
	w := startWorkload(t, env, simwork, "modules", strconv.Itoa(3*MiB), strconv.Itoa(5*MiB))
	s.report() // the context sized
	stacks := map[string]string{"cuModuleLoadData": "load_kernels", "cuLibraryLoadData": "load_library"}
	const context = "context gpu 0 7340032 cuDevicePrimaryCtxRetain"
	const internal = "driver-internal gpu 0 0 [CUDA context, kernel images and driver internals]"
	for i, step := range []struct {
		rows             []string
		nvml, modulesSum uint64
	}{
		{[]string{context, internal, "module gpu 0 3145728 cuModuleLoadData"}, 10 * MiB, 3 * MiB},
		{[]string{context, internal, "module gpu 0 3145728 cuModuleLoadData", "module gpu 0 5242880 cuLibraryLoadData"}, 15 * MiB, 8 * MiB},
		{[]string{context, internal, "module gpu 0 5242880 cuLibraryLoadData"}, 12 * MiB, 5 * MiB}, // the module unloaded
		{[]string{context, internal}, 7 * MiB, 0},                                                  // the library unloaded
	} {
		w.run()
		r := s.report()
		if got := processRows(t, r, w.pid, stacks); !slices.Equal(got, step.rows) {
			t.Errorf("step %d: rows %q, want %q", i+1, got, step.rows)
		}
		want := snapshot.ProcessMemory{PID: uint32(w.pid), Comm: "simwork", GPU: "0", NVML: step.nvml, Traced: true,
			Contexts: 7 * MiB, Modules: step.modulesSum}
		if pm := r.GPUMemory.GPUs[0].Processes; len(pm) != 1 || pm[0] != want {
			t.Errorf("step %d: view %+v, want %+v", i+1, pm, want)
		}
	}
	w.exit()
}

// TestEveryModuleLoadTraced: each of the six load functions (cuModuleLoad,
// cuModuleLoadData, cuModuleLoadDataEx, cuModuleLoadFatBinary,
// cuLibraryLoadData, cuLibraryLoadFromFile) is traced with its stack: a
// row of kind module each, together NVML's growth across them (six 1 MiB
// images), nothing left to the driver's internals. Made back to back, they
// share what NVML grew by between two reads, so each row's own bytes are
// not asserted, only their sum.
func TestEveryModuleLoadTraced(t *testing.T) {
	s, env := startOwnDriver(t, 7*MiB)
	w := startWorkload(t, env, simwork, "loads", strconv.Itoa(MiB))
	s.report()
	w.run()
	r := s.report()
	var functions []string
	var modules, internal uint64
	for _, row := range r.Rows() {
		switch {
		case row.PID != uint32(w.pid):
		case row.Kind == memory.KindModule:
			functions = append(functions, row.Frames[0].Name())
			modules += row.LiveBytes()
			if !slices.ContainsFunc(row.Frames, func(f *symbolize.Frame) bool { return f.Function == "loads_scenario" }) {
				t.Errorf("%s's stack %v, want loads_scenario in it", row.Frames[0].Name(), rowsText([]snapshot.Row{row}))
			}
		case row.Kind == memory.KindDriverInternal:
			internal += row.LiveBytes()
		}
	}
	slices.Sort(functions)
	want := []string{"cuLibraryLoadData", "cuLibraryLoadFromFile", "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary"}
	if !slices.Equal(functions, want) || modules != 6*MiB || internal != 0 {
		t.Errorf("module rows of %q, %d bytes, driver-internal %d; want %q, %d, 0", functions, modules, internal, want, 6*MiB)
	}
	w.exit()
}
