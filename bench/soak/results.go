package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gpu-mem/gpu-mem/bench/machine"
)

// growth is how much higher the last third of the churn may go than the
// middle third, the first being warm-up: more is growth, a leak.
const growth = 1.10

// trend is one figure of the agent over the churn.
type trend struct {
	name, unit      string
	warm, mid, end  float64 // at the end of warm-up, halfway, at the end of the churn
	midMax, lastMax float64 // the highest of the middle and of the last third
	max             float64
	flat            bool
	unknown         bool // too few samples to tell
}

func trendOf(name, unit string, samples []sample, value func(sample) float64) trend {
	t := trend{name: name, unit: unit, flat: true}
	n := len(samples)
	if n < 3 {
		t.unknown = true
		return t
	}
	xs := make([]float64, n)
	for i, s := range samples {
		xs[i] = value(s)
	}
	a, b := n/3, 2*n/3
	t.warm, t.mid, t.end = xs[a-1], xs[n/2], xs[n-1]
	t.midMax, t.lastMax, t.max = slices.Max(xs[a:b]), slices.Max(xs[b:]), slices.Max(xs)
	t.flat = t.lastMax <= t.midMax*growth
	return t
}

type results struct {
	churned, total  time.Duration
	procs           []*process
	samples         []sample // all of them, the settling included
	trends          []trend
	final           finalState
	restarts        int
	down            time.Duration
	pushes, dups    int
	pushErr         error
	pushedStacks    int
	pushedExact     int // processes whose pushes sum to their books, none live at the end
	pushedAllocs    int64
	pushedBytes     int64
	pidsTakenAgain  int // processes whose ID an earlier one of the run had
	scrapes, errors int
}

func (s *soak) results(start time.Time, churned time.Duration, final finalState) *results {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &results{churned: churned, total: time.Since(start), procs: s.procs, samples: s.samples, final: final}
	var churn []sample
	for _, sm := range s.samples {
		if sm.at <= churned {
			churn = append(churn, sm)
		}
	}
	r.trends = []trend{
		trendOf("agent RSS (VmRSS)", "MiB", churn, func(s sample) float64 { return s.rssMiB }),
		trendOf("goroutines", "", churn, func(s sample) float64 { return s.goroutines }),
		trendOf("live heap (go_gc_heap_live_bytes)", "MiB", churn, func(s sample) float64 { return s.heapMiB }),
		trendOf("open files", "", churn, func(s sample) float64 { return s.fds }),
	}
	r.recvFigures(s.recv)
	s.tally.mu.Lock()
	defer s.tally.mu.Unlock()
	r.pushes, r.dups, r.pushErr, r.pushedStacks = s.tally.pushes, s.tally.duplicates, s.tally.err, len(s.tally.stacks)
	// Each process's intervals: those of its ID from its start until the
	// next process given the same ID started.
	next := map[*process]time.Time{}
	lastWith := map[int]*process{}
	for _, p := range r.procs { // in the order they started
		if prev := lastWith[p.pid]; prev != nil {
			next[prev] = p.started
			r.pidsTakenAgain++
		}
		lastWith[p.pid] = p
	}
	for _, p := range r.procs {
		sum, live, found := s.tally.pushedFor(p.pid, p.started, next[p])
		r.pushedAllocs += sum.allocs
		r.pushedBytes += sum.allocBytes
		if found && p.err == nil && uint64(sum.allocs) == p.want.Allocs && uint64(sum.allocBytes) == p.want.AllocBytes && live == 0 {
			r.pushedExact++
		}
	}
	s.books.mu.Lock()
	r.scrapes, r.errors = s.books.scrapes, s.books.errors
	s.books.mu.Unlock()
	return r
}

func (r *results) recvFigures(rc *receiver) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	r.restarts, r.down = rc.restarts, rc.downTime
}

// workloadTotals sums the workloads' books and the agent's.
func (r *results) workloadTotals() (want, seen counts, exact, failed int) {
	for _, p := range r.procs {
		want.add(p.want)
		seen.add(p.seen)
		switch {
		case p.err != nil:
			failed++
		case p.exact:
			exact++
		}
	}
	return want, seen, exact, failed
}

func (r *results) losses() float64 {
	var sum float64
	for _, v := range r.final.losses {
		sum += v
	}
	return sum
}

// leftInBPF are the entries left in the agent's BPF hash maps.
func (r *results) leftInBPF() int {
	n := 0
	for _, v := range r.final.bpfMaps {
		n += v
	}
	return n
}

func (r *results) passed() bool {
	_, _, exact, _ := r.workloadTotals()
	ok := exact == len(r.procs) && r.pushedExact == len(r.procs) && r.losses() == 0 && r.final.unknown == 0 &&
		r.final.pids == 0 && r.final.err == nil && r.final.bpfErr == nil && r.leftInBPF() == 0 &&
		strings.Contains(r.final.status, "status: 0 processes") && strings.Contains(r.final.status, "symbol tables 0 ")
	for _, t := range r.trends {
		ok = ok && t.flat
	}
	return ok
}

func (r *results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Does the agent stay flat under hours of churn?\n\n")
	fmt.Fprintf(&b, "Measured on %s, by `make soak` (`go run ./bench/soak -duration %v`): the agent\n",
		machine.Describe(), *duration)
	fmt.Fprintf(&b, "(`bin/gpumem-lean agent --pyroscope-interval %v`, started first, on its own copy of the simulated driver)\n", *interval)
	fmt.Fprintf(&b, "under churn: a new process every %.1f s, each checked against its own counts before it exits;\n", 1 / *rate)
	fmt.Fprintf(&b, "the Pyroscope receiver (the tests' strict one) stopped every %v for %v. Sampled every %v.\n\n", *restartEvery, *downFor, *sampleEvery)

	byKind := map[string]int{}
	var stacks, unloads, failed int
	var lived time.Duration
	pyVersions := map[string]bool{}
	for _, p := range r.procs {
		byKind[p.kind]++
		lived += p.lifetime
		stacks += p.stacks
		if p.err == nil {
			unloads += p.unloads
		} else {
			failed++
		}
		if p.python != "" {
			pyVersions[p.python] = true
		}
	}
	var kinds []string
	for _, w := range workloads {
		kinds = append(kinds, fmt.Sprintf("%d %s", byKind[w.name], w.name))
	}
	versions := make([]string, 0, len(pyVersions))
	for v := range pyVersions {
		versions = append(versions, v)
	}
	sort.Strings(versions)

	want, seen, exact, _ := r.workloadTotals()
	b.WriteString("| what | figure |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| duration | %s of churn, then %s for the agent to settle |\n", minutes(r.churned), minutes(r.total-r.churned))
	fmt.Fprintf(&b, "| processes started | %d (%s; Python: %s), %d failed; each lived %.1f s on average, its check included |\n",
		len(r.procs), strings.Join(kinds, ", "), strings.Join(versions, ", "), failed, lived.Seconds()/float64(max(1, len(r.procs))))
	fmt.Fprintf(&b, "| distinct stacks | %s by the workloads' design (none shared between processes); %s named in the pushes |\n", thousands(int64(stacks)), thousands(int64(r.pushedStacks)))
	fmt.Fprintf(&b, "| driver unloaded (dlclose) and loaded again | %d times |\n", unloads)
	fmt.Fprintf(&b, "| Pyroscope receiver restarts | %d (down %s in all); %d pushes taken, %d series intervals received twice (counted once), agent: %.0f pushed, %.0f attempts retried, %.0f dropped, %.0f rejected |\n",
		r.restarts, minutes(r.down), r.pushes, r.dups, r.final.pushed, r.final.failed, r.final.dropped, r.final.rejected)
	for _, t := range r.trends {
		fmt.Fprintf(&b, "| %s | warm-up %s, middle %s, end %s, max %s: %s |\n", t.name, t.fmt(t.warm), t.fmt(t.mid), t.fmt(t.end), t.fmt(t.max), t.verdict())
	}
	if n := len(r.samples); n > 0 {
		last := r.samples[n-1]
		fmt.Fprintf(&b, "| agent CPU | %.1f%% of one core over the run |\n", last.cpuSeconds/last.at.Seconds()*100)
	}
	fmt.Fprintf(&b, "| books vs workloads (metrics, each process before it exits) | %d of %d processes exact; allocations %s of %s, frees %s of %s, bytes allocated %s of %s, freed %s of %s |\n",
		exact, len(r.procs), thousands(int64(seen.Allocs)), thousands(int64(want.Allocs)), thousands(int64(seen.Frees)), thousands(int64(want.Frees)),
		thousands(int64(seen.AllocBytes)), thousands(int64(want.AllocBytes)), thousands(int64(seen.FreedBytes)), thousands(int64(want.FreedBytes)))
	fmt.Fprintf(&b, "| books vs workloads (pushes, summed over intervals) | %d of %d processes exact, none live after its exit; allocations %s, bytes allocated %s (%d processes had the ID of an earlier one: their intervals told apart by time) |\n",
		r.pushedExact, len(r.procs), thousands(r.pushedAllocs), thousands(r.pushedBytes), r.pidsTakenAgain)
	fmt.Fprintf(&b, "| losses | %.0f (%s); unknown frees %.0f |\n", r.losses(), lossList(r.final.losses), r.final.unknown)
	fmt.Fprintf(&b, "| at the end | %d processes in the metrics; `%s`; BPF hash map entries: %s |\n",
		r.final.pids, r.final.status, mapList(r.final.bpfMaps, r.final.bpfErr))
	fmt.Fprintf(&b, "\nFlat: the highest sample of the churn's last third at most %.0f%% above the highest of its middle third\n", (growth-1)*100)
	fmt.Fprintf(&b, "(the first third is warm-up). Exact: every process's allocations, frees and bytes in the agent's metrics\n")
	fmt.Fprintf(&b, "equal its own counts, and its pushed intervals sum to them. Verdict: %s.\n", verdict(r.passed()))
	if r.pushErr != nil || r.final.err != nil || r.errors > 0 {
		fmt.Fprintf(&b, "\nErrors: pushes %v; final state %v; %d of %d scrapes failed.\n", r.pushErr, r.final.err, r.errors, r.scrapes)
	}
	return b.String()
}

func (t trend) fmt(v float64) string {
	if t.unit == "" {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f %s", v, t.unit)
}

func (t trend) verdict() string {
	if t.unknown {
		return "too few samples to tell"
	}
	if t.flat {
		return "flat"
	}
	return fmt.Sprintf("**grew** (last third's max %s, middle's %s)", t.fmt(t.lastMax), t.fmt(t.midMax))
}

func verdict(ok bool) string {
	if ok {
		return "pass"
	}
	return "**FAIL**"
}

func minutes(d time.Duration) string {
	if d < 2*time.Minute {
		return fmt.Sprintf("%.0f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f min", d.Minutes())
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func lossList(l map[string]float64) string {
	var parts []string
	for k, v := range l {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func mapList(m map[string]int, err error) string {
	if err != nil {
		return err.Error()
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// csv is every sample; symbol_tables and processes_traced are from the
// agent's status line then.
func (r *results) csv() string {
	var b strings.Builder
	b.WriteString("seconds,processes_started,rss_mib,heap_live_mib,goroutines,open_fds,cpu_seconds,processes_in_metrics,processes_traced,symbol_tables,receiver_up\n")
	for _, s := range r.samples {
		fmt.Fprintf(&b, "%.0f,%d,%.1f,%.1f,%.0f,%.0f,%.2f,%d,%s,%s,%t\n", s.at.Seconds(), s.started, s.rssMiB, s.heapMiB,
			s.goroutines, s.fds, s.cpuSeconds, s.pids, statusField(s.status, "status: ", " processes"),
			statusField(s.status, "symbol tables ", " "), s.receiverUp)
	}
	return b.String()
}

// statusField is the word of a status line between before and after.
func statusField(line, before, after string) string {
	_, v, ok := strings.Cut(line, before)
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, after)
	return v
}
