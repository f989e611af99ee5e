package tests

import (
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/journal"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tests/bpffs"
)

const mib = 1 << 20

// stateFixture is a private copy of the simulated driver, which only the
// test's workloads load, and a state directory and pin path of the test's.
func stateFixture(t *testing.T) (driver, state, pins string) {
	t.Helper()
	dir := t.TempDir()
	driver = filepath.Join(dir, "driver", "libcuda.so.1")
	copyFile(t, simLib, driver)
	return driver, filepath.Join(dir, "state"), filepath.Join(bpffs.Mount(t), "gpu-mem")
}

// liveBytes is a process's live bytes on the GPUs, in the agent's metrics.
func liveBytes(families map[string]*dto.MetricFamily, pid int) float64 {
	var sum float64
	for _, v := range liveByKindGPU(families, pid) {
		sum += v
	}
	return sum
}

// TestStateContinuesAcrossRestarts (issue 56, point 1): an agent with a
// state directory is stopped (SIGTERM, as a rollout does), the process
// frees and allocates while no agent runs, the next agent continues, is
// SIGKILLed, the process frees and allocates again, and a third continues.
// Each has every live byte charged to its stack, exactly, those of the
// gaps too, and the counters go on from where the last one left them.
// A second agent on the same state is refused while one owns it.
func TestStateContinuesAcrossRestarts(t *testing.T) {
	driver, state, pins := stateFixture(t)
	w := startWorkload(t, []string{"SIMCUDA_LIB=" + driver}, pythons(t)[2], filepath.Join(repoRoot, "tests/workloads/simwork.py"), "restart")
	pid := strconv.Itoa(w.pid)

	agent := func() (*cli, string) {
		c := startCLI(t, "agent", "--pid", pid, "--library", driver, "--state-dir", state, "--pin-path", pins,
			"--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "200ms")
		return c, c.metricsURL()
	}
	waitLive := func(url string, want float64) map[string]*dto.MetricFamily {
		return metricstest.ScrapeUntil(t, url, hangLimit, func(f map[string]*dto.MetricFamily) bool { return liveBytes(f, w.pid) == want })
	}

	first, url := agent()
	first.waitEvent(logs.State, "continued", true, "records", 0)
	first.waitEvent(logs.Python, "pid", w.pid)
	w.stdinLine("")
	if got := w.line(); got != "held" {
		t.Fatalf("workload said %q, want held", got)
	}
	waitLive(url, 14*mib)
	first.cmd.Process.Signal(syscall.SIGTERM)
	if err := first.cmd.Wait(); err != nil {
		t.Fatalf("the first agent at SIGTERM: %v", err)
	}

	w.stdinLine("") // a scratch buffer freed, gap_one's made, while no agent runs
	if got := w.line(); got != "gap_one" {
		t.Fatalf("workload said %q, want gap_one", got)
	}
	second, url := agent()
	second.waitEvent(logs.State, "continued", true)
	families := waitLive(url, 18*mib)
	if got := igActive(t, families, w.pid); len(got) == 0 {
		t.Fatalf("no mem_alloc_bytes_total series for pid %d", w.pid)
	}
	refused := startCLI(t, "agent", "--pid", pid, "--library", driver, "--state-dir", state, "--pin-path", pins)
	if err := refused.cmd.Wait(); err == nil {
		t.Fatal("a second agent on the state of a running one did not fail")
	}
	refused.stderr.wait(t, "another gpumem agent owns the state at "+state+" (pid "+strconv.Itoa(second.cmd.Process.Pid)+")")
	second.cmd.Process.Kill() // SIGKILL: nothing of its own done
	second.cmd.Wait()

	w.stdinLine("") // the other scratch buffer freed, gap_two's made
	w.line()        // done
	expect := w.values("expect")
	// The third agent compacts the journal at every event; a fourth
	// replays the compacted journal: the same books.
	for _, compactAt := range []int64{1, 0} {
		s := startProfiler(t, profiler.Config{Library: driver, StateDir: state, PinPath: pins, CompactJournalAt: compactAt}, w)
		s.waitEvent(logs.State, "continued", true)
		checkRestartBooks(t, s.report(), w.pid, expect)
		s.stop()
		s.p.Close()
	}
	compacted, err := os.Stat(filepath.Join(state, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	// Five live allocations, the context, the carried counters: a page.
	if compacted.Size() > 4096 {
		t.Errorf("the compacted journal: %d bytes", compacted.Size())
	}
	w.exit()
}

// checkRestartBooks checks the books of the restart scenario's process.
func checkRestartBooks(t *testing.T, r *snapshot.Snapshot, pid int, expect map[string]uint64) {
	t.Helper()
	live := map[string]uint64{}
	for _, row := range r.Rows() {
		if py := pythonFrames(row.Frames); row.PID == uint32(pid) && row.Kind == memory.KindDevice && len(py) > 1 {
			live[py[1].Function] += row.LiveBytes() // the caller of cuda_malloc
		}
	}
	want := map[string]uint64{"restart_weights": 12 * mib, "restart_scratch": 0, "gap_one": 5 * mib, "gap_two": 7 * mib}
	if !maps.Equal(live, want) {
		t.Errorf("live bytes by function after two restarts %v, want %v", live, want)
	}
	totals := processTotals(r, pid)
	wantTotals := accounting.Counters{AllocBytes: expect["alloc_bytes"], AllocCount: expect["allocs"], FreeBytes: expect["freed_bytes"], FreeCount: expect["frees"]}
	if totals != wantTotals {
		t.Errorf("the process's counters after two restarts %+v, want %+v", totals, wantTotals)
	}
	assertNoLosses(t, r)
}

// TestStateOfAnotherGPUMem: a journal written by another BPF program is
// refused with its reason, and the agent starts afresh.
func TestStateOfAnotherGPUMem(t *testing.T) {
	dir := t.TempDir()
	state, pins := filepath.Join(dir, "state"), filepath.Join(bpffs.Mount(t), "gpu-mem")
	s := startProfiler(t, profiler.Config{Library: simLib, StateDir: state, PinPath: pins})
	s.waitEvent(logs.State, "continued", true)
	s.stop()
	s.p.Close()
	file := filepath.Join(state, "journal")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	data[16] ^= 0xff // the BPF object's sum
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s = startProfiler(t, profiler.Config{Library: simLib, StateDir: state, PinPath: pins})
	said := s.waitEvent(logs.State, "continued", false, "reason", "object")
	if detail := said["detail"].(string); !strings.Contains(detail, "whose BPF program") {
		t.Errorf("refused with %q", detail)
	}
	totals, err := s.p.Totals() // gpumem_state_refused_total{reason="object"}
	if err != nil {
		t.Fatal(err)
	}
	if st := totals.State; st == nil || st.Refused != "object" || st.JournalBytes != journal.HeaderSize {
		t.Errorf("the state's totals %+v, want refused for object, a journal started afresh", st)
	}
}

// TestExitWhileNoAgent: a process that exits while no agent runs has what
// it held released by the next agent, from the exit the pinned probe saw:
// its live bytes 0, freed implicitly.
func TestExitWhileNoAgent(t *testing.T) {
	driver, state, pins := stateFixture(t)
	w := startWorkload(t, []string{"SIMCUDA_LIB=" + driver}, pythons(t)[2], filepath.Join(repoRoot, "tests/workloads/simwork.py"), "restart")
	// No --pid: the next profiler could not name the exited process; the
	// driver's private copy is this workload's alone.
	s := startProfiler(t, profiler.Config{Library: driver, StateDir: state, PinPath: pins})
	w.stdinLine("")
	if got := w.line(); got != "held" {
		t.Fatalf("workload said %q, want held", got)
	}
	if live := processTotals(s.report(), w.pid).LiveBytes(); live != 14*mib {
		t.Fatalf("%d live before the stop, want %d", live, 14*mib)
	}
	s.stop()
	s.p.Close()
	w.cmd.Process.Kill()
	w.cmd.Wait()

	s = startProfiler(t, profiler.Config{Library: driver, StateDir: state, PinPath: pins})
	s.waitEvent(logs.State, "continued", true)
	got := processTotals(s.report(), w.pid)
	if want := (accounting.Counters{AllocBytes: 14 * mib, AllocCount: 5, ImplicitFreeBytes: 14 * mib, ImplicitFreeCount: 5}); got != want {
		t.Errorf("the process that exited while no agent ran: %+v, want %+v", got, want)
	}
}

// TestGapBeyondTheRingCounted: while no agent runs, a process makes more
// events than the pinned ring buffer holds; the next agent counts the
// events it lost and the bytes of the allocations among them, exactly:
// what it saw and what it lost add up to what the process allocated.
func TestGapBeyondTheRingCounted(t *testing.T) {
	driver, state, pins := stateFixture(t)
	s := startProfiler(t, profiler.Config{Library: driver, StateDir: state, PinPath: pins})
	s.stop()
	s.p.Close()

	const pairs = 200_000 // 400k events of about 200 bytes: past the 16 MiB ring
	w := startWorkload(t, []string{"LD_LIBRARY_PATH=" + filepath.Dir(driver)}, simwork, "pairs", strconv.Itoa(pairs))
	w.run()
	w.exit()

	s = startProfiler(t, profiler.Config{Library: driver, StateDir: state, PinPath: pins})
	s.waitEvent(logs.State, "continued", true)
	r := s.report()
	totals, err := s.p.Totals()
	if err != nil {
		t.Fatal(err)
	}
	seen := processTotals(r, w.pid).AllocCount
	if lost := r.Losses[schema.RingBufferFull]; lost == 0 || seen == pairs {
		t.Fatalf("%d events lost, %d of %d allocations seen: the ring held them all", lost, seen, pairs)
	}
	if want := (pairs - seen) * 4096; totals.LostBytes != want {
		t.Errorf("lost bytes %d, want %d: %d of %d allocations of 4 KiB seen", totals.LostBytes, want, seen, pairs)
	}
}
