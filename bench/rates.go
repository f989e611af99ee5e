package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/profiler"
)

// rates finds, for 1, 4 and 8 calling threads, the highest event rate the
// tracer keeps up with: steps of doubling offered rates, each for a few
// seconds, until the first counted loss.
func rates() string {
	steps := []int{25_000, 50_000, 100_000, 200_000, 400_000, 800_000}
	seconds := 3.0
	if *smoke {
		steps, seconds = steps[:2], 0.5
	}
	var b strings.Builder
	b.WriteString("Threads allocate and free 4-8 KiB buffers at an offered rate (`simwork threads N SEC RATE`)\n")
	b.WriteString("under gpu-mem, in steps that double, for ")
	fmt.Fprintf(&b, "%.0f s each; an event is one call (an allocation or a free).\n\n", seconds)
	b.WriteString("| threads | highest rate without loss (events/s) | first step with loss |\n| ---: | ---: | --- |\n")
	best := 0.0
	for _, threads := range []int{1, 4, 8} {
		lossless, lossy := 0.0, "none up to the largest step"
		for _, offered := range steps {
			achieved, lost := rateStep(threads, offered, seconds)
			if lost > 0 {
				lossy = fmt.Sprintf("%.0f events/s: %d lost", achieved, lost)
				break
			}
			lossless = achieved
		}
		best = max(best, lossless)
		fmt.Fprintf(&b, "| %d | %.0f | %s |\n", threads, lossless, lossy)
	}
	fmt.Fprintf(&b, "\nTarget: at least 100k events/s without loss on this machine: %s (%.0f).\n", verdict(best >= 100_000), best)
	return b.String()
}

// rateStep runs one step and returns the events per second the workload
// made and the events lost.
func rateStep(threads, offered int, seconds float64) (float64, uint64) {
	p, err := profiler.New(profiler.Config{Library: simLib})
	check(err)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(100 * time.Millisecond)
	perThread := float64(offered) / 2 / float64(threads) // pairs per second
	start := time.Now()
	expect := runWorkload(nil, simwork, "threads", strconv.Itoa(threads), fmt.Sprint(seconds), fmt.Sprint(perThread))
	elapsed := time.Since(start).Seconds()
	cancel()
	check(<-done)
	r, err := p.Snapshot()
	check(err)
	return (expect["allocs"] + expect["frees"]) / elapsed, r.Losses.Total()
}
