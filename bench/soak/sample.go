package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

// sample is the agent's footprint at one moment of the run.
type sample struct {
	at time.Duration // since the start
	footprint
	started    int // processes started so far
	receiverUp bool
	status     string // the agent's last status line
}

func (s *soak) sampleLoop(start time.Time) func(context.Context) {
	return func(ctx context.Context) { every(ctx, *sampleEvery, func() { s.sampleNow(start) }) }
}

// every calls fn every period until ctx is done.
func every(ctx context.Context, period time.Duration, fn func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}

func (s *soak) sampleNow(start time.Time) {
	f, err := s.agent.footprint()
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: sample: %v\n", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sm := sample{at: time.Since(start), footprint: f, started: len(s.procs), receiverUp: s.recv.isUp(), status: s.agent.lastStatus()}
	s.samples = append(s.samples, sm)
	fmt.Fprintf(os.Stderr, "soak: %4.0fs  %d processes  RSS %.1f MiB  heap %.1f MiB  %0.f goroutines  %0.f fds  %d in metrics  %s\n",
		sm.at.Seconds(), sm.started, f.rssMiB, f.heapMiB, f.goroutines, f.fds, f.pids, sm.status)
}
