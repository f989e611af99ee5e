package tests

import (
	"fmt"
	"maps"
	"path/filepath"
	"testing"

	"github.com/gpu-mem/gpu-mem/internal/waitfor"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// TestExitedProcessesDropped: five short-lived processes, one after the
// other, each holding its own size until it exits, traced by three
// profilers on this test's own copy of the driver, each read as one path
// reads it. Read once an interval with a snapshot (the IG operator behind
// gpumem run, top), or with the interval's as it ends (the agent), each
// process is in the first read after its exit, its bytes exact, and
// dropped once the reader says it has read it: the profiler keeps exactly
// one process, then none, whatever ran before. Read once at the end
// (gpumem record), every process is in the report.
func TestExitedProcessesDropped(t *testing.T) {
	driver := filepath.Join(t.TempDir(), "driver", "libcuda.so.1")
	copyFile(t, simLib, driver) // this test's own driver: no other test's process loads it
	env := []string{"LD_LIBRARY_PATH=" + filepath.Dir(driver)}
	cfg := profiler.Config{Library: driver, Tensors: profiler.TensorsOff}
	reports, agent, record := startProfiler(t, cfg), startProfiler(t, cfg), startProfiler(t, cfg)

	// held: each interval's process, by pid, with the bytes it held.
	interval := func(held map[uint32]uint64) {
		t.Helper()
		if err := reports.p.Sync(); err != nil {
			t.Fatal(err)
		}
		read, err := reports.p.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if got := freedAtExit(t, read.Rows()); !maps.Equal(got, held) {
			t.Errorf("a snapshot: %v, want %v", got, held)
		}
		if err := agent.p.Sync(); err != nil {
			t.Fatal(err)
		}
		snap := &snapshot.Snapshot{}
		if err := agent.p.EndInterval(snap); err != nil {
			t.Fatal(err)
		}
		peaks := map[uint32]uint64{}
		for _, pk := range snap.Peaks {
			peaks[pk.PID] += pk.Bytes
		}
		if !maps.Equal(peaks, held) {
			t.Errorf("the interval's peaks: %v, want %v", peaks, held)
		}
		if got := freedAtExit(t, snap.Rows()); !maps.Equal(got, held) {
			t.Errorf("the interval snapshot's rows: %v, want %v", got, held)
		}
		for _, s := range []*session{reports, agent} {
			if n := s.p.Processes(); n != len(held) {
				t.Errorf("%d processes kept, want %d", n, len(held))
			}
		}
		reports.p.DropExited(read)
		agent.p.DropExited(snap)
		for _, s := range []*session{reports, agent} {
			if n := s.p.Processes(); n != 0 {
				t.Errorf("%d processes kept once read, want none", n)
			}
		}
	}
	all := map[uint32]uint64{}
	for i := range 5 {
		bytes := uint64(4096 * (i + 1))
		w := startWorkload(t, env, simwork, "hold", fmt.Sprint(bytes))
		w.run()
		w.exit()
		interval(map[uint32]uint64{uint32(w.pid): bytes})
		all[uint32(w.pid)] = bytes
	}
	interval(map[uint32]uint64{})

	r := record.report()
	if got := freedAtExit(t, r.Rows()); !maps.Equal(got, all) {
		t.Errorf("one report at the end: %v, want %v", got, all)
	}
	if n := record.p.Processes(); n != len(all) {
		t.Errorf("one report at the end: %d processes kept, want %d", n, len(all))
	}
	assertNoLosses(t, r)
}

// freedAtExit sums rows by process: the bytes allocated, each freed by the
// process's exit.
func freedAtExit(t *testing.T, rows []snapshot.Row) map[uint32]uint64 {
	t.Helper()
	bytes := map[uint32]uint64{}
	for _, row := range rows {
		if row.LiveBytes() != 0 || row.ImplicitFreeBytes != row.AllocBytes {
			t.Errorf("pid %d: %+v, want every byte freed by its exit", row.PID, row.Counters)
		}
		bytes[row.PID] += row.AllocBytes
	}
	return bytes
}

// TestRunDropsExitedProcesses: gpumem run (the IG operator) with a process
// that lives throughout and three short-lived ones. Each short-lived one is
// pushed with its bytes; three intervals (pushes) after the last exit, the
// books hold only the live one: the report at the end has its rows only,
// and three exits.
func TestRunDropsExitedProcesses(t *testing.T) {
	tag := gadgetImage(t)
	dir := t.TempDir()
	driver := filepath.Join(dir, "driver", "libcuda.so.1")
	copyFile(t, simLib, driver) // this test's own driver: no other test's process loads it
	env := []string{"LD_LIBRARY_PATH=" + filepath.Dir(driver)}
	r := &pyroscopetest.Receiver{}
	out := filepath.Join(dir, "run.json")
	c := startCLI(t, "run", tag, "--library", driver, "--tensors=false", "--interval", "200ms",
		"--pyroscope-url", serveReceiver(t, r), "--format", "json", "-o", out)
	c.waitEvent(logs.Attached, "library", driver)
	live := startWorkload(t, env, simwork, "hold", "1048576")
	live.run()

	exited := map[int]int64{}
	for i := range 3 {
		w := startWorkload(t, env, simwork, "hold", fmt.Sprint(4096*(i+1)))
		w.run()
		w.exit()
		exited[w.pid] = int64(4096 * (i + 1))
	}
	pushes := len(r.Received())
	waitfor.Condition(t, "three pushes after the last exit", hangLimit, func() bool { return len(r.Received()) >= pushes+3 })
	c.interrupt()
	live.exit()

	for pid, bytes := range exited {
		// Named or not: the process may be gone before its stack is.
		allocated, _, _ := workloadBytes(t, r.Received(), pid)
		var sum int64
		for _, v := range allocated {
			sum += v
		}
		if sum != bytes {
			t.Errorf("pid %d pushed allocating %v, want %d", pid, allocated, bytes)
		}
	}
	var report struct {
		Stacks []struct {
			PID            int    `json:"pid"`
			AllocatedBytes uint64 `json:"allocated_bytes"`
		} `json:"stacks"`
		Ledger struct {
			ProcessExits uint64 `json:"process_exits"`
		} `json:"ledger"`
	}
	readJSON(t, out, &report)
	held := map[int]uint64{}
	for _, s := range report.Stacks {
		held[s.PID] += s.AllocatedBytes
	}
	if want := map[int]uint64{live.pid: 1048576}; !maps.Equal(held, want) || report.Ledger.ProcessExits != 3 {
		t.Errorf("run's report: bytes by pid %v, %d exits; want %v, 3 exits", held, report.Ledger.ProcessExits, want)
	}
}
