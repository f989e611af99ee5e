// Compacting the journal to what the books still need.

package tracer

import (
	"fmt"

	"github.com/gpu-mem/gpu-mem/journal"
)

// A Compaction decides, once the journal grew, which of its events the
// books still need (what is still allocated, the contexts and modules
// of live processes), and carries the counters of the others.
type Compaction interface {
	// Needs is called with each event of the journal, in order.
	Needs(ev *Event) bool
	// Carried is called last: the counters of the events not needed, as
	// a record that the reader gets back as an Event's Carried.
	Carried() []byte
}

// JournalBytes is the size of the journal, 0 without one.
func (t *Tracer) JournalBytes() int64 {
	if t.state == nil {
		return 0
	}
	return t.state.Journal.Size()
}

// Compact rewrites the journal to the carried counters and the records c
// needs. It must be called from Read's goroutine, between two Reads, once
// every event taken was read (the books know them all); it does nothing
// otherwise, or without a journal.
func (t *Tracer) Compact(c Compaction) error {
	if t.state == nil || t.batch.next != len(t.batch.ends) {
		return nil
	}
	t.readMu.Lock() // the ring's position, in its mapping, which Close releases
	defer t.readMu.Unlock()
	if t.ring.released {
		return nil
	}
	j := t.state.Journal
	old, err := j.Records()
	if err != nil {
		return err
	}
	var kept []byte
	var ev Event
	err = journal.Each(old, func(kind journal.Kind, pos uint64, raw []byte) error {
		if kind != journal.KindRing {
			return nil // carried counters: in c's, which sum them
		}
		if err := decode(raw, &ev); err != nil {
			return fmt.Errorf("compact the journal: %w", err)
		}
		if c.Needs(&ev) {
			kept = journal.AppendRecord(kept, journal.KindRing, pos, raw)
		}
		return nil
	})
	if err != nil {
		return err
	}
	records := journal.AppendRecord(nil, journal.KindCarried, 0, c.Carried())
	return j.Rewrite(t.ring.position(), append(records, kept...))
}
