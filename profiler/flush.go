package profiler

import (
	"fmt"
	"sync"
)

// flushes count the ring buffer's flushes that the goroutine reading the
// events has read: a flush asked of the tracer is read once every event
// sent before it is.
type flushes struct {
	mu    sync.Mutex
	count uint64
	cond  *sync.Cond
}

func newFlushes() *flushes {
	f := &flushes{}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// wait flushes tr's ring buffer and returns once the flush is read. One
// flush at a time: the next one waits for the lock.
func (f *flushes) wait(tr Source) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	target := f.count + 1
	if err := tr.Flush(); err != nil {
		return fmt.Errorf("flush ring buffer: %w", err)
	}
	for f.count < target {
		f.cond.Wait()
	}
	return nil
}

// read is the reading goroutine's: a flush was read.
func (f *flushes) read() {
	f.mu.Lock()
	f.count++
	f.cond.Broadcast()
	f.mu.Unlock()
}
