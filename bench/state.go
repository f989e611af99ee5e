package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// stateCost measures what keeping the agent's state (--state-dir) costs,
// side by side with the same agent without it: the traced program's time
// per driver call pair (the kernel's side is the same program; the maps
// and probes are pinned, nothing more), the agent's own CPU per event
// (its ring reader commits a batch only once the journal has it: one
// write(2) a batch), and the journal's bytes per live allocation.
func stateCost() string {
	bpf, unmount := mountBPFFS()
	defer unmount()
	pairs, seconds, rate := "200000", 5.0, 100_000
	if *smoke {
		pairs, seconds = "2000", 1
	}
	type result struct{ nsPerPair, agentNsPerEvent float64 }
	measure := func(state bool) result {
		cfg := profiler.Config{Library: simLib}
		var args []string
		if state {
			dir, err := os.MkdirTemp("", "gpumem-bench-state")
			check(err)
			defer os.RemoveAll(dir)
			// Pins cleared after the run: probes left attached would trap
			// the next run's calls too.
			cfg.StateDir, cfg.PinPath = filepath.Join(dir, "profiler"), filepath.Join(bpf, "profiler")
			defer tracer.ClearState(cfg.PinPath)
			args = []string{"--state-dir", filepath.Join(dir, "agent"), "--pin-path", filepath.Join(bpf, "agent")}
			defer tracer.ClearState(filepath.Join(bpf, "agent"))
		}
		stop := startProfiler(cfg)
		ns := runWorkload(nil, simwork, "pairs", pairs)["ns_per_pair"]
		stop()
		var events float64
		cpu, _ := underAgent(func() {
			expect := runWorkload(nil, simwork, "threads", "1", fmt.Sprint(seconds), fmt.Sprint(rate/2))
			events = expect["allocs"] + expect["frees"]
		}, args...)
		wall := seconds + 1.5 // underAgent's: the work, then an interval
		return result{ns, cpu / 100 * wall * 1e9 / events}
	}
	var without, with []result
	for range runs {
		without = append(without, measure(false))
		with = append(with, measure(true))
	}
	pair := func(r result) float64 { return r.nsPerPair }
	agent := func(r result) float64 { return r.agentNsPerEvent }
	journal := journalBytesPerAllocation()

	var b strings.Builder
	fmt.Fprintf(&b, "The same agent without and with its state kept (`--state-dir`, `--pin-path` on a BPF file system), in turn, %d runs each:\n", runs)
	fmt.Fprintf(&b, "the traced program's time per cuMemAlloc_v2 + cuMemFree_v2 pair (`simwork pairs %s`, traced in process), and the agent's\n", pairs)
	fmt.Fprintf(&b, "CPU time per event at %d events/s for %.0f s (`simwork threads 1`; the time the agent's threads ran over the events).\n", rate, seconds)
	b.WriteString("Medians, the spread in brackets.\n\n")
	b.WriteString("| | ns per traced pair | agent CPU ns per event |\n| --- | ---: | ---: |\n")
	for _, row := range []struct {
		name string
		rs   []result
	}{{"no state", without}, {"state kept", with}} {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", row.name, spread(row.rs, pair), spread(row.rs, agent))
	}
	ratio, agentRatio := medianOf(with, pair)/medianOf(without, pair), medianOf(with, agent)/medianOf(without, agent)
	fmt.Fprintf(&b, "| ratio of the medians | %.3fx | %.2fx |\n\n", ratio, agentRatio)
	fmt.Fprintf(&b, "The journal holds %.0f bytes per live allocation of `simwork stacks` (its native stack, 10 frames deep).\n\n", journal)
	b.WriteString("The kernel's side is the same BPF object, its programs unchanged: what the state adds to a traced call is nothing\n")
	fmt.Fprintf(&b, "but noise here (the pairs' spreads %s); on the agent's side, %.0f ns of CPU per event (the journal's copy and one\n",
		overlap(without, with, pair), medianOf(with, agent)-medianOf(without, agent))
	b.WriteString("write(2) a batch), on the agent's CPUs, not the model's threads. Target: a real model within 1% of the default agent\n")
	b.WriteString("without state; on the GPU machine, `MODES=\"none default state\" bench/gpu/model.sh GPUMEM - OUT` measures it side by side.\n")
	return b.String()
}

// startProfiler traces simLib in this process until the returned stop.
func startProfiler(cfg profiler.Config) func() {
	p, err := profiler.New(cfg)
	check(err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(100 * time.Millisecond)
	return func() {
		cancel()
		check(<-done)
		check(p.Close())
	}
}

// journalBytesPerAllocation is the journal's size over the live
// allocations of a workload holding 1000 distinct stacks.
func journalBytesPerAllocation() float64 {
	bpf, unmount := mountBPFFS()
	defer unmount()
	dir, err := os.MkdirTemp("", "gpumem-bench-state")
	check(err)
	defer os.RemoveAll(dir)
	stop := startProfiler(profiler.Config{Library: simLib, StateDir: dir, PinPath: filepath.Join(bpf, "pins")})
	const n = 1000
	runWorkload(nil, simwork, "stacks", fmt.Sprint(n))
	stop()
	st, err := os.Stat(filepath.Join(dir, "journal"))
	check(err)
	return float64(st.Size()) / n
}

// mountBPFFS mounts a BPF file system of the bench's own, for pins, until
// the returned unmount.
func mountBPFFS() (string, func()) {
	dir, err := os.MkdirTemp("", "gpumem-bench-bpf")
	check(err)
	check(syscall.Mount("bpf", dir, "bpf", 0, ""))
	return dir, func() {
		syscall.Unmount(dir, syscall.MNT_DETACH)
		os.RemoveAll(dir)
	}
}

func medianOf[R any](rs []R, f func(R) float64) float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, f(r))
	}
	return median(xs)
}

// bounds are the lowest and highest of f over rs.
func bounds[R any](rs []R, f func(R) float64) (lo, hi float64) {
	lo, hi = f(rs[0]), f(rs[0])
	for _, r := range rs {
		lo, hi = min(lo, f(r)), max(hi, f(r))
	}
	return lo, hi
}

// spread is the median of f over rs and its lowest-highest.
func spread[R any](rs []R, f func(R) float64) string {
	lo, hi := bounds(rs, f)
	return fmt.Sprintf("%.0f [%.0f-%.0f]", medianOf(rs, f), lo, hi)
}

// overlap says whether the spreads of f over a and b overlap.
func overlap[R any](a, b []R, f func(R) float64) string {
	alo, ahi := bounds(a, f)
	blo, bhi := bounds(b, f)
	if alo <= bhi && blo <= ahi {
		return "overlap"
	}
	return "do not overlap"
}
