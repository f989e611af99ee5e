package tests

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/growth"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/report"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// leakCapacity is the simulated GPU's memory in the leak tests.
const leakCapacity = 1 << 30

// startLeak starts simwork.py's leak scenario on the simulated driver and
// NVML (a GPU of leakCapacity, contexts of 7 MiB) and returns it at its
// first step, its weights allocated.
func startLeak(t *testing.T) (*workload, []string) {
	capacity := "SIMCUDA_CAPACITY=" + strconv.Itoa(leakCapacity)
	t.Setenv("SIMCUDA_CAPACITY", strconv.Itoa(leakCapacity)) // the simulated NVML's, read in this process
	env := append(nvmlState(t, 7*MiB), "SIMCUDA_LIB="+simLib, capacity)
	w := startWorkload(t, env, pythons(t)[2], filepath.Join(repoRoot, "tests/workloads/simwork.py"), "leak")
	return w, env
}

// step runs one step of the leak scenario and waits for its end.
func (w *workload) step() {
	w.t.Helper()
	w.stdinLine("step")
	if line := w.line(); line != "step" {
		w.t.Fatalf("workload said %q, want step", line)
	}
}

// TestLeakFound: one step of the leak scenario an interval, as the agent
// ends them. The leak (leak_step keeps 1 MiB a step) is growing from the
// fifth interval on, and it alone: not the steady loop (steady_step
// frees what it allocates), not the cache that fills in three steps and
// stays (plateau_step), not the weights. Its rise over the window is
// exact (4 MiB in four intervals), so is its rate over the intervals'
// span, and the GPU's time to exhaustion against the simulated NVML: the
// capacity less the context and what the process holds, over the rate.
func TestLeakFound(t *testing.T) {
	w, _ := startLeak(t)
	s := startProfiler(t, profiler.Config{Library: simLib, NVML: simNVML()}, w)
	s.waitEvent(logs.NVML, "driver", "simulated")
	w.stdinLine("") // the weights, then the first step's prompt
	if line := w.line(); line != "step" {
		t.Fatalf("workload said %q, want step", line)
	}
	var d growth.Detector
	var ends []time.Time
	for i := 1; i <= 8; i++ {
		w.step()
		snap := s.endInterval(&d)
		ends = append(ends, snap.Time)
		if i < 5 {
			if len(snap.Growing) != 0 || len(snap.Exhaustion) != 0 {
				t.Fatalf("interval %d: growing %+v, exhaustion %+v: want none before the fifth", i, snap.Growing, snap.Exhaustion)
			}
			continue
		}
		if len(snap.Growing) != 1 {
			t.Fatalf("interval %d: growing %+v, want leak_step's alone", i, lines(snap.Growing))
		}
		g := snap.Growing[0]
		window := ends[i-1].Sub(ends[i-5])
		if f := report.StackLine(g.Frames, 2); f != "leak_step <- leak" || int(g.PID) != w.pid || g.GPU() != "0" {
			t.Errorf("interval %d: growing under %s of pid %d on gpu %s, want leak_step <- leak of %d on 0", i, f, g.PID, g.GPU(), w.pid)
		}
		if g.Grew != 4*MiB || g.Low != uint64(i-1)*MiB || g.Window != window || !g.Since.Equal(ends[0]) {
			t.Errorf("interval %d: grew %d to %d over %v since %v, want 4 MiB to %d MiB over %v since %v",
				i, g.Grew, g.Low, g.Window, g.Since, i-1, window, ends[0])
		}
		if want := float64(4*MiB) / window.Seconds(); g.BytesPerSecond != want {
			t.Errorf("interval %d: %f bytes/s, want %f", i, g.BytesPerSecond, want)
		}
		// The simulated NVML: the context, the weights, what leaked and
		// the cache filled, on a GPU of leakCapacity.
		used := uint64(7+8+i+6) * MiB
		if len(snap.Exhaustion) != 1 {
			t.Fatalf("interval %d: exhaustion %+v, want GPU 0's", i, snap.Exhaustion)
		}
		e := snap.Exhaustion[0]
		if e.GPU != 0 || e.Free != leakCapacity-used || e.Slack != 0 || e.BytesPerSecond != g.BytesPerSecond {
			t.Errorf("interval %d: %+v, want gpu 0, %d free, at %f bytes/s", i, e, leakCapacity-used, g.BytesPerSecond)
		}
		if want := float64(leakCapacity-used) / g.BytesPerSecond; e.Seconds != want {
			t.Errorf("interval %d: %f s to exhaustion, want %f", i, e.Seconds, want)
		}
		if len(e.Processes) != 1 || int(e.Processes[0].PID) != w.pid || e.Processes[0].Share != 1 {
			t.Errorf("interval %d: shares %+v, want pid %d's, 1", i, e.Processes, w.pid)
		}
	}
	w.stdinLine("end")
	if line := w.line(); line != "done" {
		t.Fatalf("workload said %q, want done", line)
	}
}

// endInterval ends an interval as the agent does once every event sent so
// far is accounted: its snapshot, the breakdown, then what grows.
func (s *session) endInterval(d *growth.Detector) *snapshot.Snapshot {
	s.t.Helper()
	snap := s.takeInterval()
	breakdown.Fill(snap, breakdown.Default())
	d.Observe(snap)
	return snap
}

// lines are growing rows as the status line says them.
func lines(growing []snapshot.Growing) string {
	var out string
	for _, g := range growing {
		out += fmt.Sprintf("\n  %s", report.GrowingLine(g))
	}
	return out
}
