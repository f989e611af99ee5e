package tests

import (
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// simNVML is the simulated libnvidia-ml.so.1, in a folder of its own.
func simNVML() string { return filepath.Join(repoRoot, "build/sim/nvml/libnvidia-ml.so.1") }

// nvmlState gives the test process and the workloads it starts one state
// of the simulated NVML (SIMNVML_DIR), with contexts of ctxBytes; it
// returns the workloads' environment.
func nvmlState(t *testing.T, ctxBytes uint64) []string {
	dir := t.TempDir()
	t.Setenv("SIMNVML_DIR", dir)
	return []string{"SIMNVML_DIR=" + dir, "SIMCUDA_CONTEXT_BYTES=" + strconv.FormatUint(ctxBytes, 10)}
}

// TestNVMLReadsTheSimulatedDriver: the nvml package, loaded without cgo,
// reads what the simulated driver's processes hold as NVML reports it:
// a context each, plus their device allocations rounded up to 512 bytes;
// a process gone is no longer listed.
func TestNVMLReadsTheSimulatedDriver(t *testing.T) {
	env := nvmlState(t, 7*MiB)
	a := startWorkload(t, env, simwork, "hold", "1000")
	b := startWorkload(t, env, simwork, "hold", strconv.Itoa(3*MiB))
	a.run()
	b.run()
	n, err := nvml.Open(simNVML())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var s nvml.Sample
	if err := n.Read(&s); err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 1 || s.GPUs[0].UUID != "GPU-00000000-0000-4000-8000-000000000000" || s.GPUs[0].Total != 80<<30 {
		t.Fatalf("GPUs %+v, want one of 80 GiB", s.GPUs)
	}
	want := []nvml.Process{{PID: uint32(a.pid), Used: 7*MiB + 1024}, {PID: uint32(b.pid), Used: 10 * MiB}}
	got := slices.SortedFunc(slices.Values(s.GPUs[0].Processes), func(x, y nvml.Process) int { return int(x.PID) - int(y.PID) })
	slices.SortFunc(want, func(x, y nvml.Process) int { return int(x.PID) - int(y.PID) })
	if !slices.Equal(got, want) || s.GPUs[0].Used != 17*MiB+1024 {
		t.Errorf("processes %+v, used %d; want %+v, used %d", got, s.GPUs[0].Used, want, 17*MiB+1024)
	}
	a.exit()
	if err := n.Read(&s); err != nil {
		t.Fatal(err)
	}
	if want := []nvml.Process{{PID: uint32(b.pid), Used: 10 * MiB}}; !slices.Equal(s.GPUs[0].Processes, want) {
		t.Errorf("after an exit: processes %+v, want %+v", s.GPUs[0].Processes, want)
	}
	b.exit()
}

// TestNVMLMissing: without the driver's library, Open says why.
func TestNVMLMissing(t *testing.T) {
	if _, err := nvml.Open(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")); err == nil {
		t.Fatal("opened a library that is not there")
	}
	t.Setenv("SIMNVML_DIR", "")
	_, err := nvml.Open(simNVML())
	var nerr *nvml.Error
	if !errors.As(err, &nerr) || nerr.Func != "nvmlInit_v2" || nerr.Code != 9 {
		t.Fatalf("error %v, want nvmlInit_v2: Driver Not Loaded (9)", err)
	}
}

// TestReconciledWithNVML: what NVML says each process uses on the GPU is
// in the books: a traced process's memory as traced (a 1000-byte
// allocation), the rest of NVML's number (its 7 MiB context, the
// allocation's rounding) a row of its own; an untraced process's whole
// number a row of its own. The context was made before gpu-mem attached:
// the allocation's GPU is unknown, but NVML lists the process on one GPU
// only, where it is reconciled. The view says each number, and the GPU's
// memory.used is the rows' sum.
func TestReconciledWithNVML(t *testing.T) {
	env := nvmlState(t, 7*MiB)
	traced := startWorkload(t, env, simwork, "hold", "1000")
	other := startWorkload(t, env, simwork, "hold", strconv.Itoa(3*MiB))
	other.run()
	s := startProfiler(t, profiler.Config{Library: simLib, NVML: simNVML()}, traced)
	s.waitLog("NVML: driver simulated")
	traced.run()
	r := s.report()
	type where struct {
		pid  int
		kind memory.Kind
		gpu  string
	}
	live := map[where]uint64{}
	frames := map[where]string{}
	for _, row := range r.Rows() {
		k := where{int(row.PID), row.Kind, row.GPU()}
		live[k] += row.LiveBytes()
		frames[k] = row.Frames[0].Name()
	}
	want := map[where]uint64{
		{traced.pid, memory.KindDevice, "unknown"}:   1000,
		{traced.pid, memory.KindDriverInternal, "0"}: 7*MiB + 24,
		{other.pid, memory.KindUntraced, "0"}:        10 * MiB,
	}
	if !maps.Equal(live, want) {
		t.Errorf("live %v, want %v", live, want)
	}
	if f := frames[where{other.pid, memory.KindUntraced, "0"}]; f != "[process gpu-mem does not trace]" {
		t.Errorf("untraced frame %q", f)
	}
	if r.GPUMemory == nil || len(r.GPUMemory.GPUs) != 1 {
		t.Fatalf("GPU memory %+v, want one GPU", r.GPUMemory)
	}
	gpu := r.GPUMemory.GPUs[0]
	wantProcs := []snapshot.ProcessMemory{
		{PID: uint32(traced.pid), Comm: "simwork", GPU: "0", NVML: 7*MiB + 1024, Traced: true, Driver: 1000, DriverInternal: 7*MiB + 24},
		{PID: uint32(other.pid), Comm: "simwork", GPU: "0", NVML: 10 * MiB},
	}
	slices.SortFunc(wantProcs, func(a, b snapshot.ProcessMemory) int { return int(a.PID) - int(b.PID) })
	if gpu.Used != 17*MiB+1024 || gpu.NotOfProcesses != 0 || !slices.Equal(gpu.Processes, wantProcs) {
		t.Errorf("GPU %+v, want used %d, processes %+v", gpu, 17*MiB+1024, wantProcs)
	}
	traced.exit()
	other.exit()
}
