package kubernetes

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFirstEventsCounted: a process's first allocations and its first
// out-of-memory failure are in rate() and increase() over a window, exactly,
// in Prometheus's own scrape loop and PromQL engine (tests/promql), both ways
// the agent gives Prometheus their start:
//   - its series exist at 0 from its CUDA context on, before its first
//     allocation: a Prometheus of any version that scraped them then counts
//     what follows;
//   - each counter carries its created timestamp (the protobuf exposition's),
//     which Prometheus's created-timestamp-zero-ingestion turns into a zero
//     sample: counted even when the allocations came before the first
//     scrape (and not without it: checked too).
func TestFirstEventsCounted(t *testing.T) {
	agent, driver := startAgentFirst(t, 1, func(args ...string) *process {
		return start(t, nil, filepath.Join(root, "bin/gpumem"), args...)
	}, "--tensors=false", "--metrics-address", "127.0.0.1:0", "--pyroscope-interval", "1s")
	target := agent.metricsURL(t)
	plain := startPrometheus(t, target)
	simwork := filepath.Join(root, "build/sim/simwork")
	const held = 8 * MiB
	oomEnv := append([]string{"SIMCUDA_CAPACITY=1000000"}, driver.env...)
	oomSeries := func(pid string) string {
		return `gpumem_failures_total{pid="` + pid + `",code="2",kind="device",gpu="0"}`
	}
	allocSeries := func(pid string) string { return `mem_alloc_bytes_total{pid="` + pid + `",host_raw="0"}` }

	// Scraped at 0 after its context, then it allocates (or fails).
	holder := startReady(t, driver.env, simwork, "hold", strconv.Itoa(held))
	failer := startReady(t, oomEnv, simwork, "oom", "2000000")
	plain.waitLast(t, allocSeries(holder), 0)
	plain.waitLast(t, `gpumem_allocated_bytes_total{pid="`+holder+`",kind="device",gpu="0"}`, 0)
	plain.waitLast(t, oomSeries(failer), 0)
	for _, w := range []string{holder, failer} {
		fmt.Fprintln(workloads[w].stdin)
	}
	plain.waitLast(t, allocSeries(holder), held)
	plain.waitLast(t, oomSeries(failer), 1)
	checkIncrease(t, plain, allocSeries(holder), held)
	checkIncrease(t, plain, `gpumem_allocated_bytes_total{pid="`+holder+`",kind="device",gpu="0"}`, held)
	checkIncrease(t, plain, oomSeries(failer), 1)

	// A process that made its context and ended before allocating: its
	// series at 0 go with it.
	idle := startReady(t, driver.env, simwork, "hold", strconv.Itoa(held))
	plain.waitLast(t, allocSeries(idle), 0)
	workloads[idle].cmd.Process.Kill()
	workloads[idle].cmd.Wait()
	plain.waitGone(t, allocSeries(idle), allocSeries(holder))

	// Allocates (or fails) before the Prometheus servers started next
	// first scrape: only the created timestamps tell them where the
	// counters started.
	lateHolder := startReady(t, driver.env, simwork, "hold", strconv.Itoa(held))
	lateFailer := startReady(t, oomEnv, simwork, "oom", "2000000")
	for _, w := range []string{lateHolder, lateFailer} {
		fmt.Fprintln(workloads[w].stdin)
		if !workloads[w].out.Scan() || workloads[w].out.Text() != "done" {
			t.Fatalf("workload %s did not run", w)
		}
	}
	plain.waitLast(t, allocSeries(lateHolder), held)
	plain.waitLast(t, oomSeries(lateFailer), 1)
	created := startPrometheus(t, target, "-created-timestamps")
	unaware := startPrometheus(t, target)
	for _, pr := range []*prometheus{created, unaware} {
		pr.waitLast(t, allocSeries(lateHolder), held)
		pr.waitLast(t, oomSeries(lateFailer), 1)
	}
	checkIncrease(t, created, allocSeries(lateHolder), held)
	checkIncrease(t, created, `gpumem_allocated_bytes_total{pid="`+lateHolder+`",kind="device",gpu="0"}`, held)
	checkIncrease(t, created, oomSeries(lateFailer), 1)
	// Without them, a series whose first sample holds its first counts
	// has no increase to read: what the agent's zero series are there for.
	for _, sel := range []string{allocSeries(lateHolder), oomSeries(lateFailer)} {
		first := unaware.samples(t, sel)[0].Samples[0]
		if got := unaware.query(t, "increase("+sel+"[5m])", first.T); first.V == 0 || len(got) != 0 {
			t.Errorf("without created timestamps, %s's first sample %v, increase %+v: want its counts, no increase", sel, first, got)
		}
	}
}

// workloads are the processes startReady started, by PID.
var workloads = map[string]*process{}

// startReady starts a simulated workload and waits until it has made its
// CUDA context; it returns its PID.
func startReady(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	w := start(t, env, name, args...)
	if !w.out.Scan() || !strings.HasPrefix(w.out.Text(), "ready ") {
		t.Fatalf("%s %v did not start", name, args)
	}
	pid := strconv.Itoa(w.cmd.Process.Pid)
	workloads[pid] = w
	return pid
}

// checkIncrease evaluates increase(sel[5m]) at the time of the first
// sample that holds the series' last value: the window reaches back past
// the process's start, so it is every count since, exactly (rate() is
// increase over the window's seconds).
func checkIncrease(t *testing.T, pr *prometheus, sel string, want float64) {
	t.Helper()
	series := pr.samples(t, sel)
	if len(series) != 1 {
		t.Fatalf("%s: %d series", sel, len(series))
	}
	samples := series[0].Samples
	at := samples[len(samples)-1].T
	for i := len(samples) - 1; i >= 0 && samples[i].V == samples[len(samples)-1].V; i-- {
		at = samples[i].T
	}
	got := pr.query(t, "increase("+sel+"[5m])", at)
	if len(got) != 1 || *got[0].Value != want {
		t.Errorf("increase(%s[5m]) at %d: %+v, want %v (samples %v)", sel, at, got, want, samples)
	}
}
