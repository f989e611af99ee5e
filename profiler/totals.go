package profiler

import (
	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
)

// Totals are the books summed per process, kind and device: what metrics
// need, without resolving a stack.
type Totals struct {
	Series       []Series
	Failures     []SeriesFailures
	Losses       schema.Losses
	UnknownFrees uint64
	Events       uint64 // events read
	// The on-demand tensor views (Config.Tensors TensorsOnDemand), the
	// frees of tensors made before their view began, and how many views
	// the budget switched off.
	TensorViews     []TensorView
	FreesBeforeView uint64
	BudgetExceeded  uint64
}

// SeriesKey names a process's memory of one kind on one device: the key
// of the rows summed over their stacks.
type SeriesKey struct {
	PID    uint32
	Kind   memory.Kind
	Device int32
}

func seriesOf(k accounting.Key) SeriesKey { return SeriesKey{k.PID, k.Kind, k.Device} }

// GPU is where the series' memory lives (memory.GPU).
func (k SeriesKey) GPU() string { return memory.GPU(k.Kind, k.Device) }

// Series is one process's memory of one kind on one device.
type Series struct {
	SeriesKey
	Comm      string
	Container container.Identity
	accounting.Counters
}

// SeriesFailures counts one process's failed allocations of one kind on
// one device with one result.
type SeriesFailures struct {
	SeriesKey
	Comm      string
	Container container.Identity
	Result    int32
	Count     uint64
}

// Totals sums the books, without naming a stack: what a scrape of the
// metrics reads. Loss counters that cannot be read are an error.
func (p *Profiler) Totals() (Totals, error) {
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
		s.Comm, s.Container = procs[s.PID].comm, procs[s.PID].container
	}
	for i := range t.Failures {
		f := &t.Failures[i]
		f.Comm, f.Container = procs[f.PID].comm, procs[f.PID].container
	}
	return t, err
}

// sumBooks sums the books' rows and failures per series.
func (p *Profiler) sumBooks() (Totals, error) {
	losses, err := p.currentLosses()
	b := p.books
	b.mu.Lock()
	defer b.mu.Unlock()
	stats := b.ledger.Stats()
	t := Totals{Losses: losses, UnknownFrees: stats.UnknownFrees, FreesBeforeView: stats.FreesBeforeView, Events: b.events}
	series := map[SeriesKey]int{}
	b.ledger.Rows(func(k accounting.Key, c accounting.Counters) {
		if !p.onGPU(k) {
			return
		}
		sk := seriesOf(k)
		i, ok := series[sk]
		if !ok {
			i = len(t.Series)
			series[sk] = i
			t.Series = append(t.Series, Series{SeriesKey: sk})
		}
		t.Series[i].Counters.Add(c)
	})
	type failureKey struct {
		SeriesKey
		result int32
	}
	failures := map[failureKey]int{}
	b.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if !p.onGPU(k.Key) {
			return
		}
		fk := failureKey{seriesOf(k.Key), k.Result}
		i, ok := failures[fk]
		if !ok {
			i = len(t.Failures)
			failures[fk] = i
			t.Failures = append(t.Failures, SeriesFailures{SeriesKey: fk.SeriesKey, Result: k.Result})
		}
		t.Failures[i].Count += f.Count
	})
	return t, err
}
