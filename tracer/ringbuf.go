// Reading the events of the ring buffer.

package tracer

import (
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/journal"
	"github.com/gpu-mem/gpu-mem/memory"
)

// pollInterval bounds how long an event waits in the ring buffer while
// events come: the BPF program wakes the reader only once a quarter of the
// buffer is full. While none come, each empty look doubles the wait, up to
// idlePollInterval; then the reader sleeps (sleep), to be woken by the next
// event: an idle agent is not woken to find nothing (nor, with it, the Go
// runtime's monitor of threads in system calls). A flush (Sync, a
// snapshot) wakes the reader at once.
//
// asleepWait bounds a sleep: an event whose program looked at
// reader_asleep just before the reader set it does not wake it, and waits
// this long at most.
const (
	pollInterval     = 10 * time.Millisecond
	idlePollInterval = time.Second
	asleepWait       = 10 * time.Second
)

// batch holds the records taken from the ring (or replayed from the
// journal) and not yet read, back to back, and the journal's records of
// those the journal keeps.
type batch struct {
	raw     []byte
	ends    []int // each record's end in raw
	next    int   // the next record to read
	kept    []byte
	flushed bool // ringbuf.ErrFlushed is due once the records are read
}

func (b *batch) add(pos uint64, raw []byte) {
	b.raw = append(b.raw, raw...)
	b.ends = append(b.ends, len(b.raw))
}

// keep adds a ring record to the journal's records too, if it is kept.
func (b *batch) keep(pos uint64, raw []byte) {
	b.add(pos, raw)
	if journaled(raw) {
		b.kept = journal.AppendRecord(b.kept, journal.KindRing, pos, raw)
	}
}

func (b *batch) pop() ([]byte, bool) {
	if b.next == len(b.ends) {
		return nil, false
	}
	start := 0
	if b.next > 0 {
		start = b.ends[b.next-1]
	}
	b.next++
	return b.raw[start:b.ends[b.next-1]], true
}

func (b *batch) reset() {
	b.raw, b.ends, b.next, b.kept = b.raw[:0], b.ends[:0], 0, b.kept[:0]
}

// journaled says whether a ring record goes to the journal: the driver's
// view and the processes' exits, which the next agent continues. The
// tensor view is not continued: its probes end with the agent that
// switched it on, and the next one starts it again where asked.
func journaled(raw []byte) bool {
	if len(raw) == tensorFreeSize || len(raw) < headerSize {
		return false
	}
	op := opOf(raw)
	return op.Space() != memory.SpaceTensor && op != memory.OpTensorOOM
}

// Read blocks for the next event. It reuses ev's storage, and must not be
// called from two goroutines. After Close it returns an error wrapping
// os.ErrClosed; after Flush, once every event sent before it has been read,
// ringbuf.ErrFlushed.
func (t *Tracer) Read(ev *Event) error {
	if t.carried != nil {
		*ev = Event{Carried: t.carried, Stack: ev.Stack[:0], PyFrames: ev.PyFrames[:0]}
		t.carried = nil
		return nil
	}
	for {
		if raw, ok := t.batch.pop(); ok {
			if err := decode(raw, ev); err != nil {
				return err
			}
			t.stacks.resolve(ev)
			return nil
		}
		if t.batch.flushed {
			t.batch.flushed = false
			return ringbuf.ErrFlushed
		}
		if err := t.refill(); err != nil {
			return err
		}
	}
}

// refill takes the records written since the last take, journaled first
// when there is a journal, or waits for some: the batch is read past it
// without the lock, in memory of its own.
func (t *Tracer) refill() error {
	t.readMu.Lock() // the ring's mappings, which Close releases
	defer t.readMu.Unlock()
	if t.ring.released {
		return os.ErrClosed
	}
	flushes := t.ring.flushes.Load() // asked before the records are looked at
	closed := t.ring.closed.Load()
	t.batch.reset()
	each := t.batch.add
	keep := func() error { return nil }
	if t.state != nil {
		each = t.batch.keep
		keep = func() error { return t.state.Journal.Append(t.batch.kept) }
	}
	found, err := t.ring.take(each, keep)
	if err != nil {
		return err
	}
	if flushes > t.flushesRead {
		t.flushesRead, t.batch.flushed = flushes, true
	}
	switch {
	case found || t.batch.flushed:
		t.idleWait = 0
		return nil
	case closed:
		return os.ErrClosed
	}
	if t.idleWait == idlePollInterval {
		return t.sleep()
	}
	t.idleWait = min(max(2*t.idleWait, pollInterval), idlePollInterval)
	return t.ring.wait(t.idleWait)
}

// sleep waits for the next event, which wakes the reader (reader_asleep),
// a flush or close, or asleepWait.
func (t *Tracer) sleep() error {
	if err := t.objs.ReaderAsleep.Put(uint32(0), uint32(1)); err != nil {
		return t.ring.wait(idlePollInterval)
	}
	if t.ring.pending() > 0 { // sent before the flag was set
		return nil
	}
	return t.ring.wait(asleepWait)
}

// NamedPyStacks counts the events Read returned whose Python frames the
// BPF program named by those of an earlier event of the thread instead of
// sending them. Like Read, it must not be called from two goroutines.
func (t *Tracer) NamedPyStacks() uint64 { return t.stacks.named }

// Flush makes Read return the events already sent, then ringbuf.ErrFlushed.
func (t *Tracer) Flush() error { return t.ring.flush() }
