package tests

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
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
	s.waitEvent(logs.Attached, "library", lib)
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

// TestModulesInEveryOutput: a process's module (3 MiB, load_kernels) and
// library (5 MiB, load_library), loaded while the agent and top trace it,
// are in their outputs beside its 7 MiB context: Prometheus's
// gpumem_live_bytes{kind="module"}, Pyroscope's memory:inuse_space (the
// process's nvidia-smi number, 15 MiB, with load_kernels and load_library
// in its stacks) and top's line. Top attached after the context was made:
// it is in its driver-internal part. Each waits for a read of NVML with
// the process in it before the loads (the agent's scans, top's first
// line, record's NVML loaded), so that the loads' growth is measured from
// before them; record's JSON, pprof and HTML files have them too. The two
// loads come back to back: top may size both in one read, sharing the 8
// MiB alike, so the modules' sum is asserted, not each row's (which
// TestModuleChargedToItsStack does).
func TestModulesInEveryOutput(t *testing.T) {
	env := nvmlState(t, 7*MiB)
	agent, driver, r, lib := startNVMLAgent(t)
	w := startWorkload(t, append(env, driver.env...), simwork, "modules", strconv.Itoa(3*MiB), strconv.Itoa(5*MiB))
	pid := strconv.Itoa(w.pid)
	target := append([]string{"--pid", pid, "--library", driver.path}, lib...)
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	records := []*cli{
		startCLI(t, append([]string{"record", "--format", "json", "-o", file("gpu.json")}, target...)...),
		startCLI(t, append([]string{"record", "--format", "pprof", "-o", file("gpu.pb.gz")}, target...)...),
		startCLI(t, append([]string{"record", "--format", "html", "-o", file("gpu.html")}, target...)...),
	}
	for _, c := range records {
		c.waitEvent(logs.NVML, "driver", "simulated") // read once the library is loaded: before the loads
	}
	top := startCLI(t, append([]string{"top", "--interval", "200ms"}, target...)...)
	top.waitStdout(`^  pid ` + pid + ` \(simwork\): 7\.0 MiB, not traced$`) // no event of it yet
	agent.metricsURL()
	w.run() // the module
	w.run() // the library
	const used = 15 * MiB
	checkModuleMetrics(t, agent.metricsURL(), w.pid)
	const inuse = "memory:inuse_space:bytes:space:bytes"
	waitForPush(t, r, w.pid, fmt.Sprintf("push of %s %d", inuse, used), func(totals map[string]int64) bool { return totals[inuse] == used })
	if got := pushedLoads(t, r.Received(), w.pid); got != 8*MiB {
		t.Errorf("Pyroscope: %d bytes in use under load_kernels and load_library, want %d", got, 8*MiB)
	}
	top.waitStdout(`^  pid ` + pid + ` \(simwork\), gpu 0: 15\.0 MiB = 0 B traced \+ 0 B in contexts seen made \+ 8\.0 MiB in modules seen loaded \+ 7\.0 MiB kernel images and driver internals$`)
	top.interrupt()
	for _, c := range records {
		c.interrupt()
	}
	w.exit()
	checkRecordedModules(t, file, w.pid)
}

// checkRecordedModules reads record's files of pid, which loaded 8 MiB of
// modules beside 7 MiB of context: the JSON's module rows and its process's
// module_bytes, pprof's memory in use under load_kernels and load_library,
// and the HTML's root (nvidia-smi's number).
func checkRecordedModules(t *testing.T, file func(string) string, pid int) {
	t.Helper()
	var r nvmlReport
	readJSON(t, file("gpu.json"), &r)
	var rows uint64
	for _, s := range r.Stacks {
		if s.PID == pid && s.Kind == "module" {
			rows += s.LiveBytes
		}
	}
	if len(r.GPUs) != 1 || len(r.GPUs[0].Processes) != 1 || rows != 8*MiB {
		t.Fatalf("JSON: module rows %d bytes, gpus %+v; want %d", rows, r.GPUs, 8*MiB)
	}
	if p := r.GPUs[0].Processes[0]; p.PID != pid || p.NVML != 15*MiB || p.Modules != 8*MiB {
		t.Errorf("JSON process %+v, want nvml_bytes %d, module_bytes %d", p, 15*MiB, 8*MiB)
	}
	var loads int64
	for _, s := range readProfile(t, file("gpu.pb.gz")).Sample {
		if slices.ContainsFunc(s.Location, func(l *profile.Location) bool {
			return l.Line[0].Function.Name == "load_kernels" || l.Line[0].Function.Name == "load_library"
		}) {
			loads += s.Value[3]
		}
	}
	if loads != 8*MiB {
		t.Errorf("pprof: %d bytes in use under load_kernels and load_library, want %d", loads, 8*MiB)
	}
	if got := frameAttr(t, dumpDOM(t, "file://"+file("gpu.html")), "root", "all processes", "data-bytes"); got != strconv.Itoa(15*MiB) {
		t.Errorf("HTML root: %s bytes, want %d", got, 15*MiB)
	}
}

// pushedLoads is the memory in use that the last push of pid's profile
// has under load_kernels or load_library.
func pushedLoads(t *testing.T, pushes []*pushv1.PushRequest, pid int) int64 {
	t.Helper()
	var last int64
	for _, req := range pushes {
		for _, series := range req.Series {
			if l := pyroscopetest.Labels(series); l["pid"] != strconv.Itoa(pid) || l[pyroscope.LabelName] != pyroscope.ProfileName {
				continue
			}
			last = 0
			for _, s := range parseSeries(t, series).Sample {
				if slices.ContainsFunc(s.Location, func(l *profile.Location) bool {
					return l.Line[0].Function.Name == "load_kernels" || l.Line[0].Function.Name == "load_library"
				}) {
					last += s.Value[3]
				}
			}
		}
	}
	return last
}

// checkModuleMetrics scrapes the agent, which saw the context made, until
// pid's gpumem_live_bytes are 8 MiB of kind module, 7 MiB of kind context
// and nothing of kind driver-internal.
func checkModuleMetrics(t *testing.T, url string, pid int) {
	t.Helper()
	sum := func(f map[string]*dto.MetricFamily, kind string) uint64 {
		var n float64
		for _, m := range f["gpumem_live_bytes"].GetMetric() {
			if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(pid) && l["kind"] == kind {
				n += m.GetGauge().GetValue()
			}
		}
		return uint64(n)
	}
	exact := func(f map[string]*dto.MetricFamily) bool {
		return sum(f, "module") == 8*MiB && sum(f, "context") == 7*MiB && sum(f, "driver-internal") == 0
	}
	if f := metricstest.ScrapeUntil(t, url, hangLimit, exact); !exact(f) {
		t.Errorf("gpumem_live_bytes of pid %d: module %d, context %d, driver-internal %d; want %d, %d, 0",
			pid, sum(f, "module"), sum(f, "context"), sum(f, "driver-internal"), 8*MiB, 7*MiB)
	}
}
