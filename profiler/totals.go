package profiler

import (
	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
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
}

// Series is one process's memory of one kind on one device.
type Series struct {
	accounting.Key // Stack is zero: summed over stacks
	Comm           string
	Container      k8smeta.Container
	accounting.Counters
}

// SeriesFailures counts one process's failed allocations of one kind on
// one device with one result.
type SeriesFailures struct {
	accounting.Key // Stack is zero
	Comm           string
	Container      k8smeta.Container
	Result         int32
	Count          uint64
}

// Totals sums the books. Loss counters that cannot be read are an error.
func (p *Profiler) Totals() (Totals, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	losses, err := p.currentLosses()
	t := Totals{Losses: losses, UnknownFrees: p.ledger.Stats().UnknownFrees, Events: p.events}
	series := map[accounting.Key]int{}
	p.ledger.Rows(func(k accounting.Key, c accounting.Counters) {
		if !p.onGPU(k) {
			return
		}
		k.Stack = 0
		i, ok := series[k]
		if !ok {
			i = len(t.Series)
			series[k] = i
			t.Series = append(t.Series, Series{Key: k, Comm: p.comms[k.PID], Container: p.containers[k.PID].Named(p.cfg.Pods)})
		}
		t.Series[i].Counters.Add(c)
	})
	failures := map[accounting.FailureKey]int{}
	p.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if !p.onGPU(k.Key) {
			return
		}
		k.Stack = 0
		k.Op = 0
		i, ok := failures[k]
		if !ok {
			i = len(t.Failures)
			failures[k] = i
			t.Failures = append(t.Failures, SeriesFailures{Key: k.Key, Comm: p.comms[k.PID], Container: p.containers[k.PID].Named(p.cfg.Pods), Result: k.Result})
		}
		t.Failures[i].Count += f.Count
	})
	return t, err
}
