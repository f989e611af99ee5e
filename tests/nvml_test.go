package tests

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
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
	s.waitEvent(logs.NVML, "driver", "simulated")
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
	// A peak is never below what is held: the driver view's peaks hold
	// NVML's part too, each GPU's (the allocation, made before the
	// recorder started, is on no GPU the driver named).
	peaks := map[string]uint64{}
	for _, pk := range r.Peaks {
		if int(pk.PID) == traced.pid && pk.View == memory.ViewDriver {
			peaks[pk.GPU] = pk.Bytes
			if len(pk.Rows) == 0 || pk.Rows[0].Frames == nil {
				t.Errorf("peak on GPU %s: rows %+v, want named", pk.GPU, pk.Rows)
			}
		}
	}
	if want := map[string]uint64{"0": 7*MiB + 24, "unknown": 1000}; !maps.Equal(peaks, want) {
		t.Errorf("peaks %v, want %v", peaks, want)
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

// TestNVMLInEveryOutput: a traced process holding 1000 bytes in a 7 MiB
// context, beside an untraced one holding 3 MiB in its own, recorded by
// every output at once; the agent, there first, saw the context made, the
// recorders did not (it is in their driver-internal part). Each shows nvidia-smi's number for the traced
// process (7 MiB + 1024: the context and the allocation rounded up) as its
// driver view, and the untraced one's 10 MiB: pprof's inuse_space per pid
// and its total, nvidia-smi's memory.used (go tool pprof), folded's total,
// the HTML flame graph's root, JSON's stacks and gpus, record's --top
// summary, top, Prometheus's gpumem_live_bytes and gpumem_gpu_used_bytes,
// and Pyroscope's memory:inuse_space.
func TestNVMLInEveryOutput(t *testing.T) {
	env := nvmlState(t, 7*MiB)
	other := startWorkload(t, env, simwork, "hold", strconv.Itoa(3*MiB))
	other.run()
	dir := t.TempDir()
	agent, driver, r, lib := startNVMLAgent(t)
	w := startWorkload(t, append(env, driver.env...), simwork, "hold", "1000")
	pid := strconv.Itoa(w.pid)
	target := append([]string{"--pid", pid, "--library", driver.path}, lib...)
	file := func(name string) string { return filepath.Join(dir, name) }
	clis := map[string]*cli{
		"pprof":  startCLI(t, append([]string{"record", "--format", "pprof", "-o", file("gpu.pb.gz"), "--top", "3"}, target...)...),
		"folded": startCLI(t, append([]string{"record", "--format", "folded", "-o", file("gpu.folded")}, target...)...),
		"html":   startCLI(t, append([]string{"record", "--format", "html", "-o", file("gpu.html")}, target...)...),
		"json":   startCLI(t, append([]string{"record", "--format", "json", "-o", file("gpu.json")}, target...)...),
		"top":    startCLI(t, append([]string{"top", "--interval", "200ms"}, target...)...),
	}
	for _, c := range clis {
		c.waitEvent(logs.Attached, "kind", "driver")
		c.waitEvent(logs.NVML, "driver", "simulated")
	}
	agent.waitEvent(logs.NVML, "driver", "simulated")
	w.run()
	const traced, untraced, used = 7*MiB + 1024, 10 * MiB, 17*MiB + 1024
	checkNVMLMetrics(t, agent.metricsURL(), w.pid, other.pid)
	checkNVMLPyroscope(t, r, w.pid)
	clis["top"].waitStdout(`^GPU 0 \(GPU-00000000-0000-4000-8000-000000000000\): 17\.0 MiB used of 80\.0 GiB \(nvidia-smi\)$`)
	clis["top"].waitStdout(`^  pid ` + pid + ` \(simwork\), gpu 0: 7\.0 MiB = 1000 B traced \+ 0 B in contexts seen made \+ 0 B in modules seen loaded \+ 7\.0 MiB kernel images and driver internals$`)
	clis["top"].waitStdout(`^  pid ` + strconv.Itoa(other.pid) + ` \(simwork\): 10\.0 MiB, not traced$`)
	for _, c := range clis {
		c.interrupt()
	}
	w.exit()
	other.exit()

	p := readProfile(t, file("gpu.pb.gz"))
	byPID := map[int64]int64{}
	for _, s := range p.Sample {
		byPID[s.NumLabel["pid"][0]] += s.Value[3]
	}
	if want := map[int64]int64{int64(w.pid): traced, int64(other.pid): untraced}; !maps.Equal(byPID, want) || p.SampleType[3].Type != "inuse_space" {
		t.Errorf("pprof inuse_space by pid %v, want %v", byPID, want)
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-unit=B", file("gpu.pb.gz")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf(" of %dB total", used)) {
		t.Errorf("go tool pprof: %v, want %dB total:\n%s", err, used, out)
	}
	if got := foldedTotal(t, file("gpu.folded")); got != used {
		t.Errorf("folded: %d bytes, want %d", got, used)
	}
	if got := frameAttr(t, dumpDOM(t, "file://"+file("gpu.html")), "root", "all processes", "data-bytes"); got != strconv.Itoa(used) {
		t.Errorf("HTML root: %s bytes, want %d", got, used)
	}
	checkNVMLJSON(t, file("gpu.json"), w.pid, other.pid)
	summary := clis["pprof"].stderr.wait(t, "GPU 0 (GPU-", "  pid "+pid+" (simwork), gpu 0: ")
	if want := "GPU 0 (GPU-00000000-0000-4000-8000-000000000000): 17.0 MiB used of 80.0 GiB (nvidia-smi)"; summary[0] != want {
		t.Errorf("--top: %q, want %q", summary[0], want)
	}
}

// nvmlReport is what the NVML tests read of record's JSON report: the
// stacks' live bytes and the GPUs' numbers.
type nvmlReport struct {
	Stacks []struct {
		PID       int    `json:"pid"`
		Kind      string `json:"kind"`
		LiveBytes uint64 `json:"live_bytes"`
	} `json:"stacks"`
	GPUs []struct {
		UsedBytes uint64 `json:"used_bytes"`
		Processes []struct {
			PID            int    `json:"pid"`
			NVML           uint64 `json:"nvml_bytes"`
			Traced         bool   `json:"traced"`
			Driver         uint64 `json:"driver_bytes"`
			Contexts       uint64 `json:"context_bytes"`
			Modules        uint64 `json:"module_bytes"`
			DriverInternal int64  `json:"driver_internal_bytes"`
		} `json:"processes"`
	} `json:"gpus"`
}

// checkNVMLJSON reads the JSON report: the GPU's and each process's
// numbers, and the traced process's stacks summing to its NVML number.
func checkNVMLJSON(t *testing.T, path string, pid, other int) {
	t.Helper()
	var r nvmlReport
	readJSON(t, path, &r)
	live := map[string]uint64{}
	for _, s := range r.Stacks {
		live[strconv.Itoa(s.PID)+" "+s.Kind] += s.LiveBytes
	}
	want := map[string]uint64{
		strconv.Itoa(pid) + " device": 1000, strconv.Itoa(pid) + " driver-internal": 7*MiB + 24,
		strconv.Itoa(other) + " untraced": 10 * MiB,
	}
	if !maps.Equal(live, want) {
		t.Errorf("JSON stacks' live bytes %v, want %v", live, want)
	}
	if len(r.GPUs) != 1 || r.GPUs[0].UsedBytes != 17*MiB+1024 || len(r.GPUs[0].Processes) != 2 {
		t.Fatalf("JSON gpus %+v", r.GPUs)
	}
	for _, p := range r.GPUs[0].Processes {
		switch p.PID {
		case pid:
			if p.NVML != 7*MiB+1024 || !p.Traced || p.Driver != 1000 || p.Contexts != 0 || p.DriverInternal != 7*MiB+24 {
				t.Errorf("JSON traced process %+v", p)
			}
		case other:
			if p.NVML != 10*MiB || p.Traced {
				t.Errorf("JSON untraced process %+v", p)
			}
		}
	}
}

// checkNVMLMetrics scrapes the agent until the traced process's
// gpumem_live_bytes sum to its NVML number (its 7 MiB context, seen made,
// apart), and so does its gpumem_peak_bytes (a peak is never below what is
// held), and the untraced one's is there; gpumem_gpu_used_bytes is the
// GPU's memory.used.
func checkNVMLMetrics(t *testing.T, url string, pid, other int) {
	t.Helper()
	sum := func(f map[string]*dto.MetricFamily, pid int, kind string) uint64 {
		var n float64
		for _, m := range f["gpumem_live_bytes"].GetMetric() {
			l := metricstest.Labels(m)
			if l["pid"] == strconv.Itoa(pid) && (kind == "" || l["kind"] == kind) {
				n += m.GetGauge().GetValue()
			}
		}
		return uint64(n)
	}
	used := func(f map[string]*dto.MetricFamily) uint64 {
		for _, m := range f["gpumem_gpu_used_bytes"].GetMetric() {
			if metricstest.Labels(m)["gpu"] == "0" {
				return uint64(m.GetGauge().GetValue())
			}
		}
		return 0
	}
	peak := func(f map[string]*dto.MetricFamily) uint64 {
		for _, m := range f["gpumem_peak_bytes"].GetMetric() {
			if l := metricstest.Labels(m); l["pid"] == strconv.Itoa(pid) && l["gpu"] == "0" {
				return uint64(m.GetGauge().GetValue())
			}
		}
		return 0
	}
	exact := func(f map[string]*dto.MetricFamily) bool {
		return sum(f, pid, "") == 7*MiB+1024 && peak(f) == 7*MiB+1024 && sum(f, pid, "context") == 7*MiB && sum(f, pid, "driver-internal") == 24 &&
			sum(f, other, "untraced") == 10*MiB && used(f) == 17*MiB+1024
	}
	if f := metricstest.ScrapeUntil(t, url, hangLimit, exact); !exact(f) {
		t.Errorf("gpumem_live_bytes: pid %d %d (context %d, driver-internal %d; peak %d), untraced pid %d %d; gpumem_gpu_used_bytes %d",
			pid, sum(f, pid, ""), sum(f, pid, "context"), sum(f, pid, "driver-internal"), peak(f), other, sum(f, other, "untraced"), used(f))
	}
}

// checkNVMLPyroscope waits for a push whose memory:inuse_space of the
// traced process is its NVML number.
func checkNVMLPyroscope(t *testing.T, r *pyroscopetest.Receiver, pid int) {
	t.Helper()
	const inuse = "memory:inuse_space:bytes:space:bytes"
	waitForPush(t, r, pid, fmt.Sprintf("push of %s %d", inuse, 7*MiB+1024), func(totals map[string]int64) bool { return totals[inuse] == 7*MiB+1024 })
	if refused := r.Refused(); len(refused) != 0 {
		t.Errorf("refused: %v", refused)
	}
}

// TestWithoutNVML: where NVML cannot be read (no driver: the simulated
// NVML without its state), the profiler says so once and the parts beyond
// the traced memory are unknown (no view, no rows of NVML's); the traced
// rows are what they are without it.
func TestWithoutNVML(t *testing.T) {
	t.Setenv("SIMNVML_DIR", "")
	w := startWorkload(t, nil, simwork, "hold", "1000")
	s := startProfiler(t, profiler.Config{Library: simLib, NVML: simNVML()}, w)
	w.run()
	r := s.report()
	s.report()
	said := 0
	s.logs.mu.Lock()
	lines := slices.Clone(s.logs.lines)
	s.logs.mu.Unlock()
	for _, line := range lines {
		if strings.HasPrefix(line, "NVML: ") {
			said++
			if !strings.Contains(line, "nvmlInit_v2: Driver Not Loaded (9): the memory nvidia-smi shows beyond what is traced (contexts, kernel images, driver internals) is unknown") {
				t.Errorf("said %q", line)
			}
		}
	}
	rows := r.Rows()
	if said != 1 || r.GPUMemory != nil || len(rows) != 1 || rows[0].Kind != memory.KindDevice || rows[0].LiveBytes() != 1000 {
		t.Errorf("said %d times, GPU memory %v, rows %v; want once, none, 1000 device bytes", said, r.GPUMemory, rowsText(rows))
	}
	w.exit()
}

// TestContextChargedToItsStack: a process that makes its context while
// traced has the context's bytes (NVML's growth across its creation, 7
// MiB) charged to the stack that made it (cuDevicePrimaryCtxRetain,
// called from main), its allocation on the context's GPU, and the
// allocation's rounding (24 bytes) left to the driver's internals. The
// context is sized before the allocation (the reader reads NVML again as
// it sees the context made, within the tracer's poll, 10 ms: here, a
// report waits for that read).
func TestContextChargedToItsStack(t *testing.T) {
	env := nvmlState(t, 7*MiB)
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1") // this test's own: no other process on it
	copyFile(t, simLib, lib)
	s := startProfiler(t, profiler.Config{Library: lib, NVML: simNVML()})
	s.waitEvent(logs.Attached, "library", lib)
	w := startWorkload(t, append(env, "LD_LIBRARY_PATH="+dir), simwork, "hold", "1000")
	s.report()
	w.run()
	r := s.report()
	var got []string
	for _, row := range r.Rows() {
		if row.PID == uint32(w.pid) {
			got = append(got, fmt.Sprintf("%s gpu %s %d %s", row.Kind, row.GPU(), row.LiveBytes(), row.Frames[0].Name()))
			if row.Kind == memory.KindContext && !slices.ContainsFunc(row.Frames, func(f *symbolize.Frame) bool { return f.Function == "main" }) {
				t.Errorf("context's stack %v, want main in it", rowsText([]snapshot.Row{row}))
			}
		}
	}
	want := []string{
		"context gpu 0 7340032 cuDevicePrimaryCtxRetain",
		"device gpu 0 1000 cuMemAlloc_v2",
		"driver-internal gpu 0 24 [CUDA context, kernel images and driver internals]",
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("rows %q, want %q", got, want)
	}
	pm := r.GPUMemory.GPUs[0].Processes
	if len(pm) != 1 || pm[0].NVML != 7*MiB+1024 || pm[0].Driver != 1000 || pm[0].Contexts != 7*MiB || pm[0].DriverInternal != 24 {
		t.Errorf("view %+v", pm)
	}
	w.exit()
}

// startNVMLAgent starts a Pyroscope receiver, then the agent, first, on the
// simulated NVML: serving metrics, pushing to the receiver every 200 ms.
// lib names the simulated NVML, for the commands started after it.
func startNVMLAgent(t *testing.T) (agent *cli, driver agentDriver, r *pyroscopetest.Receiver, lib []string) {
	t.Helper()
	r = &pyroscopetest.Receiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pyroscopetest.Serve(t, r, lis)
	lib = []string{"--nvml-library", simNVML()}
	agent, driver = startAgentFirst(t, 1, append(lib, "--metrics-address", "127.0.0.1:0",
		"--pyroscope-url", "http://"+lis.Addr().String(), "--pyroscope-interval", "200ms")...)
	return agent, driver, r, lib
}
