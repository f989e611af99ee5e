package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpu-mem/gpu-mem/breakdown"
	"github.com/gpu-mem/gpu-mem/growth"
	"github.com/gpu-mem/gpu-mem/profiler"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// growthFlags find what grows for record and top, as the agent does at
// each of its intervals: an interval of low-water marks ends every
// --growth-interval.
type growthFlags struct {
	interval time.Duration
	detector growth.Detector
	last     snapshot.Snapshot // the last interval's: its Growing and Exhaustion
}

func (g *growthFlags) register(fs *pflag.FlagSet) {
	fs.DurationVar(&g.interval, "growth-interval", pyroscope.DefaultInterval, "the interval whose low-water marks (the least each stack held) are compared "+
		"to find what grows (the agent's --pyroscope-interval)")
	registerGrowthIntervals(fs, &g.detector)
}

func (g *growthFlags) validate() error {
	if g.interval <= 0 {
		return fmt.Errorf("--growth-interval must be positive")
	}
	return checkGrowthIntervals(g.detector)
}

// registerGrowthIntervals registers --growth-intervals, the detector's
// Intervals: the agent's, record's and top's.
func registerGrowthIntervals(fs *pflag.FlagSet, d *growth.Detector) {
	fs.IntVar(&d.Intervals, "growth-intervals", growth.DefaultIntervals, "a stack is growing when the least it held in an interval "+
		"rose in each of this many intervals in a row: a leak, in the status line, gpumem_growing_* and memory:growth_space")
}

func checkGrowthIntervals(d growth.Detector) error {
	if d.Intervals < 1 {
		return fmt.Errorf("--growth-intervals must be at least 1")
	}
	return nil
}

// follow ends an interval every g.interval until ctx is done. Not to be
// run beside another reader of p's intervals.
func (g *growthFlags) follow(ctx context.Context, p *profiler.Profiler, rules *breakdown.Rules) {
	ticker := time.NewTicker(g.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			g.endInterval(p, rules)
		}
	}
}

// endInterval ends an interval of the low-water marks and finds what grows.
func (g *growthFlags) endInterval(p *profiler.Profiler, rules *breakdown.Rules) {
	_ = p.EndInterval(&g.last) // a loss counter's read error: said by the final snapshot
	breakdown.Fill(&g.last, rules)
	g.detector.Observe(&g.last)
}
