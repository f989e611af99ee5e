package profiler

import (
	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Totals sums the books, without naming a stack: what a scrape of the
// metrics reads. Loss counters that cannot be read are an error.
func (p *Profiler) Totals() (snapshot.Totals, error) {
	p.procs.readNoted() // every row of a process read has its pod and GPUs
	t, err := p.sumBooks()
	procs := map[uint32]*process{}
	for _, s := range t.Series {
		procs[s.PID] = nil
	}
	for _, f := range t.Failures {
		procs[f.PID] = nil
	}
	p.procs.lookup(procs)
	t.TensorViews, t.BudgetExceeded = p.tensors.list(), p.BudgetExceeded()
	for i := range t.Series {
		s := &t.Series[i]
		s.Comm, s.Container = procs[s.PID].Comm, procs[s.PID].Container
	}
	for i := range t.Failures {
		f := &t.Failures[i]
		f.Comm, f.Container = procs[f.PID].Comm, procs[f.PID].Container
	}
	return t, err
}

// sumBooks sums the books' rows and failures per series.
func (p *Profiler) sumBooks() (snapshot.Totals, error) {
	losses, err := p.currentLosses()
	b := p.books
	b.mu.Lock()
	defer b.mu.Unlock()
	stats := b.ledger.Stats()
	t := snapshot.Totals{Losses: losses, UnknownFrees: stats.UnknownFrees, FreesBeforeView: stats.FreesBeforeView, Events: b.events}
	series := map[snapshot.SeriesKey]int{}
	b.ledger.Rows(func(k accounting.Key, c accounting.Counters) {
		if !p.onGPU(k) {
			return
		}
		sk := snapshot.SeriesOf(k)
		i, ok := series[sk]
		if !ok {
			i = len(t.Series)
			series[sk] = i
			t.Series = append(t.Series, snapshot.Series{SeriesKey: sk})
		}
		t.Series[i].Counters.Add(c)
	})
	type failureKey struct {
		snapshot.SeriesKey
		result int32
	}
	failures := map[failureKey]int{}
	b.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if !p.onGPU(k.Key) {
			return
		}
		fk := failureKey{snapshot.SeriesOf(k.Key), k.Result}
		i, ok := failures[fk]
		if !ok {
			i = len(t.Failures)
			failures[fk] = i
			t.Failures = append(t.Failures, snapshot.SeriesFailures{SeriesKey: fk.SeriesKey, Result: k.Result})
		}
		t.Failures[i].Count += f.Count
	})
	return t, err
}
