package profiler

import (
	"errors"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Totals sums the books, without naming a stack: what a scrape of the
// metrics reads. Loss counters that cannot be read are an error.
func (p *Profiler) Totals() (snapshot.Totals, error) {
	p.procs.readNoted() // every row of a process read has its pod and GPUs
	p.gpus.await()
	t, err := p.sumBooks()
	p.gpus.addSeries(&t, p.onGPU)
	procs := map[uint32]*process{}
	for _, s := range t.Series {
		procs[s.PID] = nil
	}
	for _, f := range t.Failures {
		procs[f.PID] = nil
	}
	p.procs.lookup(procs)
	t.TensorViews, t.BudgetExceeded = p.tensors.list(), p.BudgetExceeded()
	t.DriverViewsOff, t.DriverBudgetExceeded = p.DriverViewsOff(), p.DriverBudgetExceeded()
	t.State = p.stateKept()
	for i := range t.Series {
		if s := &t.Series[i]; s.Kind != memory.KindUntraced {
			s.Comm, s.Container, s.Since = procs[s.PID].Comm, procs[s.PID].Container, procs[s.PID].Since
		}
	}
	for i := range t.Failures {
		f := &t.Failures[i]
		f.Comm, f.Container, f.Since = procs[f.PID].Comm, procs[f.PID].Container, procs[f.PID].Since
	}
	return t, err
}

// sumBooks sums the books' rows and failures per series.
func (p *Profiler) sumBooks() (snapshot.Totals, error) {
	losses, err := p.currentLosses()
	t := p.books.sum(p.onGPU)
	t.Losses = losses
	if _, closed := p.books.lastLosses(); !closed {
		lost, lostErr := p.tr.LostBytes()
		t.LostBytes, err = lost, errors.Join(err, lostErr)
	}
	return t, err
}

// seriesSums sums rows into the series of a Totals, one per process, kind
// and device, after the series it holds already.
type seriesSums struct {
	t  *snapshot.Totals
	at map[snapshot.SeriesKey]int // index in t.Series
}

func newSeriesSums(t *snapshot.Totals) seriesSums {
	return seriesSums{t: t, at: map[snapshot.SeriesKey]int{}}
}

// add adds row k's counters c to its series, and returns the series.
func (s seriesSums) add(k accounting.Key, c accounting.Counters) *snapshot.Series {
	sk := snapshot.SeriesOf(k)
	i, ok := s.at[sk]
	if !ok {
		i = len(s.t.Series)
		s.at[sk] = i
		s.t.Series = append(s.t.Series, snapshot.Series{SeriesKey: sk})
	}
	s.t.Series[i].Counters.Add(c)
	return &s.t.Series[i]
}
