package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"
	pushv1 "github.com/grafana/pyroscope/api/gen/proto/go/push/v1"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/metrics"
	"github.com/gpu-mem/gpu-mem/metrics/metricstest"
	"github.com/gpu-mem/gpu-mem/pyroscope"
	"github.com/gpu-mem/gpu-mem/pyroscope/pyroscopetest"
	"github.com/gpu-mem/gpu-mem/schema"
)

// counts are one process's books: the workload's own (its expect line),
// or the agent's.
type counts struct {
	Allocs, AllocBytes, Frees, FreedBytes uint64
}

func (c *counts) add(o counts) {
	c.Allocs += o.Allocs
	c.AllocBytes += o.AllocBytes
	c.Frees += o.Frees
	c.FreedBytes += o.FreedBytes
}

// countsFrom reads a workload's expect line: allocs=, alloc_bytes=,
// frees=, freed_bytes=, among others.
func countsFrom(line string) (counts, error) {
	var c counts
	fields := map[string]*uint64{"allocs": &c.Allocs, "alloc_bytes": &c.AllocBytes, "frees": &c.Frees, "freed_bytes": &c.FreedBytes}
	found := 0
	for _, kv := range strings.Fields(line) {
		k, v, _ := strings.Cut(kv, "=")
		if dst, ok := fields[k]; ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return c, fmt.Errorf("expect %s: %w", kv, err)
			}
			*dst = n
			found++
		}
	}
	if found != len(fields) {
		return c, fmt.Errorf("expect line without its totals: %q", line)
	}
	return c, nil
}

// bookLimit is how long the agent has to show a process's books once the
// process said them: it reads events a moment after they are sent, on a
// machine the soak shares.
const bookLimit = 30 * time.Second

// books checks processes' books in the agent's metrics while they live:
// one scrape for every process waiting, a few times a second.
type books struct {
	url string

	mu      sync.Mutex
	waiting map[int]*waiter
	scrapes int
	errors  int
	lastErr error
}

type waiter struct {
	want     counts
	deadline time.Time
	done     chan bookResult
}

type bookResult struct {
	seen  counts
	exact bool
}

func newBooks(url string) *books { return &books{url: url, waiting: map[int]*waiter{}} }

// expect waits until the agent's books of pid are want, or for limit;
// it returns the books seen last and whether they were exact.
func (b *books) expect(pid int, want counts, limit time.Duration) (counts, bool) {
	w := &waiter{want: want, deadline: time.Now().Add(limit), done: make(chan bookResult, 1)}
	b.mu.Lock()
	b.waiting[pid] = w
	b.mu.Unlock()
	r := <-w.done
	return r.seen, r.exact
}

// run scrapes while processes wait, until ctx is done.
func (b *books) run(ctx context.Context) { every(ctx, 200*time.Millisecond, b.check) }

// check scrapes once if a process waits, and answers those whose books are
// exact or whose time is up.
func (b *books) check() {
	b.mu.Lock()
	n := len(b.waiting)
	b.mu.Unlock()
	if n == 0 {
		return
	}
	families, err := metricstest.Get(b.url)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scrapes++
	if err != nil {
		b.errors++
		b.lastErr = err
	}
	seen := booksByPID(families) // none when the scrape failed
	now := time.Now()
	for pid, w := range b.waiting {
		c := seen[pid]
		if c == w.want || now.After(w.deadline) {
			w.done <- bookResult{c, c == w.want}
			delete(b.waiting, pid)
		}
	}
}

// booksByPID sums the driver view's series of each process.
func booksByPID(families map[string]*dto.MetricFamily) map[int]counts {
	names := metrics.ViewNames(memory.ViewDriver)
	out := map[int]counts{}
	each := func(name string, add func(c *counts, v uint64)) {
		for _, m := range families[name].GetMetric() {
			pid, _ := strconv.Atoi(metricstest.Labels(m)[schema.PID])
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			c := out[pid]
			add(&c, uint64(v))
			out[pid] = c
		}
	}
	each(names.Allocations, func(c *counts, v uint64) { c.Allocs += v })
	each(names.Frees, func(c *counts, v uint64) { c.Frees += v })
	each(names.AllocatedBytes, func(c *counts, v uint64) { c.AllocBytes += v })
	// Freed bytes are what was allocated and is not live: the live
	// bytes are kept there until then.
	each(names.LiveBytes, func(c *counts, v uint64) { c.FreedBytes += v })
	for pid, c := range out {
		c.FreedBytes = c.AllocBytes - c.FreedBytes
		out[pid] = c
	}
	return out
}

// pushTally reads the pushes as they come: each series' interval once
// (a push retried after the receiver took it is a second copy), per
// process ID and interval what was allocated and what was live at its
// end, and the distinct stacks named. Over a long run process IDs are
// taken again: intervals go to processes by their time (pushedFor).
type pushTally struct {
	mu         sync.Mutex
	pushes     int
	duplicates int // series intervals received twice
	seen       map[string]bool
	pids       map[int]map[int64]*pushed // by the interval's end
	stacks     map[uint64]bool
	err        error
}

// pushed is what the series of one process pushed for one interval.
type pushed struct {
	allocs, allocBytes int64
	inuse              int64 // bytes live at its end
}

func newPushTally() *pushTally {
	return &pushTally{seen: map[string]bool{}, pids: map[int]map[int64]*pushed{}, stacks: map[uint64]bool{}}
}

// pushedFor sums the intervals of the process that started at start with
// an ID that the next process given it took at next (zero: none did): the
// intervals that end in between. last is what was live at the end of the
// last of them.
func (t *pushTally) pushedFor(pid int, start, next time.Time) (sum pushed, last int64, found bool) {
	var lastEnd int64
	for end, p := range t.pids[pid] {
		if end < start.UnixNano() || !next.IsZero() && end >= next.UnixNano() {
			continue
		}
		found = true
		sum.allocs += p.allocs
		sum.allocBytes += p.allocBytes
		if end > lastEnd {
			lastEnd, last = end, p.inuse
		}
	}
	return sum, last, found
}

// foldPushes takes the receiver's pushes every few seconds, until ctx is
// done.
func (s *soak) foldPushes(ctx context.Context) {
	every(ctx, 5*time.Second, func() { s.tally.add(s.recv.r.Take()) })
}

func (t *pushTally) add(reqs []*pushv1.PushRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, req := range reqs {
		t.pushes++
		for _, series := range req.Series {
			if err := t.addSeries(series); err != nil && t.err == nil {
				t.err = err
			}
		}
	}
}

func (t *pushTally) addSeries(series *pushv1.RawProfileSeries) error {
	labels := pyroscopetest.Labels(series)
	if labels[schema.Kind] == memory.KindTensor.String() {
		return nil // no tensors in the soak
	}
	if labels[pyroscope.LabelName] != pyroscope.ProfileName {
		return nil // a process's malloc series: the same bytes allocated again
	}
	pid, err := strconv.Atoi(labels[schema.PID])
	if err != nil {
		return fmt.Errorf("series without a pid: %v", labels)
	}
	for _, raw := range series.Samples {
		p, err := profile.ParseData(raw.RawProfile)
		if err != nil {
			return err
		}
		key := fmt.Sprint(labels, p.TimeNanos)
		if t.seen[key] {
			t.duplicates++
			continue
		}
		t.seen[key] = true
		idx := map[string]int{}
		for i, st := range p.SampleType {
			idx[st.Type] = i
		}
		if t.pids[pid] == nil {
			t.pids[pid] = map[int64]*pushed{}
		}
		pp := t.pids[pid][p.TimeNanos]
		if pp == nil {
			pp = &pushed{}
			t.pids[pid][p.TimeNanos] = pp
		}
		for _, sample := range p.Sample {
			pp.allocs += sample.Value[idx["alloc_objects"]]
			pp.allocBytes += sample.Value[idx["alloc_space"]]
			pp.inuse += sample.Value[idx["inuse_space"]]
			t.stacks[stackHash(sample)] = true
		}
	}
	return nil
}

// stackHash identifies a named stack: its frames' functions and lines.
func stackHash(s *profile.Sample) uint64 {
	h := fnv.New64a()
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			fmt.Fprintf(h, "%s:%d;", line.Function.Name, line.Line)
		}
	}
	return h.Sum64()
}
