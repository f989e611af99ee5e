// Reading the events of the ring buffer.

package tracer

import (
	"errors"
	"os"
	"time"
)

// pollInterval bounds how long an event waits in the ring buffer: the BPF
// program wakes the reader only once the buffer fills.
const pollInterval = 10 * time.Millisecond

// Read blocks for the next event. It reuses ev's storage, and must not be
// called from two goroutines. After Close it returns an error wrapping
// os.ErrClosed; after Flush, once every event sent before it has been read,
// ringbuf.ErrFlushed.
func (t *Tracer) Read(ev *Event) error {
	for {
		err := t.reader.ReadInto(&t.record)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.reader.SetDeadline(time.Now().Add(pollInterval))
			continue
		}
		if err != nil {
			return err
		}
		if err := decode(t.record.RawSample, ev); err != nil {
			return err
		}
		t.stacks.resolve(ev)
		return nil
	}
}

// NamedPyStacks counts the events Read returned whose Python frames the
// BPF program named by those of an earlier event of the thread instead of
// sending them. Like Read, it must not be called from two goroutines.
func (t *Tracer) NamedPyStacks() uint64 { return t.stacks.named }

// Flush makes Read return the events already sent, then ringbuf.ErrFlushed.
func (t *Tracer) Flush() error { return t.reader.Flush() }
