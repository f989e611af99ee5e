package profiler

// The books across restarts (Config.StateDir): the events a previous agent
// journaled are replayed through handle, their counters carried, and the
// journal compacted to what is still needed.

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvmlparts"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// compactJournalAt is the journal's size from which it is compacted by
// default: what a replay or a compaction reads into the agent's heap at
// once, small beside the chart's memory limit (256 MiB). A server that
// allocates its weights and KV cache once journals a few hundred records
// (240 bytes each with a 10-frame native stack); a process whose every
// tensor reaches the driver fills it in seconds, until its driver view's
// budget switches it off.
const compactJournalAt = 16 << 20

// carried is a journal's record of the counters its compaction dropped
// the events of, per process, kind and GPU, and its failures.
type carried struct {
	Rows     []carriedRow     `json:"rows"`
	Failures []carriedFailure `json:"failures,omitempty"`
}

type carriedRow struct {
	PID      uint32              `json:"pid"`
	Kind     memory.Kind         `json:"kind"`
	Device   int32               `json:"device"`
	Counters accounting.Counters `json:"counters"`
}

type carriedFailure struct {
	carriedRow
	Op       memory.Op           `json:"op"`
	Result   int32               `json:"result"`
	Failures accounting.Failures `json:"failures"`
}

// carry enters a journal's carried counters, each in its process's row of
// no stack: they hold nothing.
func (b *books) carry(record []byte) error {
	var c carried
	if err := json.Unmarshal(record, &c); err != nil {
		return fmt.Errorf("read the journal's carried counters: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := bpfNow()
	for _, r := range c.Rows {
		b.ledger.Carry(accounting.Key{PID: r.PID, Kind: r.Kind, Device: r.Device}, r.Counters, now)
	}
	for _, f := range c.Failures {
		k := accounting.Key{PID: f.PID, Kind: f.Kind, Device: f.Device}
		b.ledger.CarryFailures(accounting.FailureKey{Key: k, Op: f.Op, Result: f.Result}, f.Failures)
	}
	return nil
}

// endReplay ends the replay of a previous agent's events: the driver
// views it switched off are off (what they held released now, as they
// were then), and what it allocated is not this agent's to push again.
func (p *Profiler) endReplay() {
	now := bpfNow()
	for _, pid := range p.continued.DriverOff {
		p.books.endDriverView(pid, now)
		p.driver.switchedOff(pid, "switched off by the agent before a restart", time.Now())
	}
	p.books.endReplay()
}

func (b *books) endReplay() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ledger.EndReplay()
	b.replaying = false
}

// stateKept is what the profiler keeps of its state, nil without one.
func (p *Profiler) stateKept() *snapshot.State {
	if p.journal == nil {
		return nil
	}
	s := &snapshot.State{JournalBytes: p.tr.JournalBytes()}
	if r := p.continued.Refused; r != nil {
		s.Refused = r.Reason
	}
	return s
}

// compaction decides which journaled events the books still need: a live
// allocation's, the contexts and modules of a process that did not exit,
// and the frees and retains of a VMM handle still live (its references).
// The counters of the others are carried: the books now less what the
// events kept count (kept, in a ledger of their own).
type compaction struct {
	b    *books
	kept *accounting.Ledger
}

func (b *books) compaction() *compaction { return &compaction{b: b, kept: accounting.New()} }

func (c *compaction) Needs(ev *tracer.Event) bool {
	c.b.mu.Lock()
	need := c.b.needsLocked(ev)
	c.b.mu.Unlock()
	if need {
		applyToLedger(c.kept, ev, key(ev, 0))
	}
	return need
}

func (b *books) needsLocked(ev *tracer.Event) bool {
	if _, exited := b.exitedAt[ev.PID]; exited || ev.Exit {
		return false
	}
	switch {
	case ev.Op.MakesContext(), ev.Op == memory.OpCtxDestroy, ev.Op.LoadsModule(), ev.Op.UnloadsModule():
		return b.contexts[nvmlparts.ProcessDevice{PID: ev.PID, Device: ev.Device}]
	case ev.Op.IsFree(), ev.Op.IsRetain():
		made, live := b.ledger.Allocated(ev.PID, memory.SpaceHandle, ev.Address)
		return ev.Op.Space() == memory.SpaceHandle && live && made < ev.Timestamp
	case ev.Result == memory.CUDASuccess:
		made, live := b.ledger.Allocated(ev.PID, ev.Op.Space(), ev.Address)
		return live && made == ev.Timestamp
	}
	return false // a failure: carried
}

// Carried sums, per process that did not exit, kind and GPU, the books'
// counters less the kept events', and every failure.
func (c *compaction) Carried() []byte {
	sums := map[snapshot.SeriesKey]*accounting.Counters{}
	sum := func(k accounting.Key) *accounting.Counters {
		rk := snapshot.SeriesOf(k)
		if sums[rk] == nil {
			sums[rk] = &accounting.Counters{}
		}
		return sums[rk]
	}
	c.kept.Rows(func(k accounting.Key, n accounting.Counters) { sum(k).Subtract(n) })
	var out carried
	c.b.mu.Lock()
	c.b.ledger.Rows(func(k accounting.Key, n accounting.Counters) {
		if _, exited := c.b.exitedAt[k.PID]; !exited {
			sum(k).Add(n)
		}
	})
	c.b.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if _, exited := c.b.exitedAt[k.PID]; !exited {
			row := carriedRow{PID: k.PID, Kind: k.Kind, Device: k.Device}
			out.Failures = append(out.Failures, carriedFailure{carriedRow: row, Op: k.Op, Result: k.Result, Failures: f})
		}
	})
	c.b.mu.Unlock()
	for k, n := range sums {
		if *n != (accounting.Counters{}) {
			out.Rows = append(out.Rows, carriedRow{PID: k.PID, Kind: k.Kind, Device: k.Device, Counters: *n})
		}
	}
	record, _ := json.Marshal(out) // of plain fields: no error
	return record
}
