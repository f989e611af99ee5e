package profiler

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// script is a Source whose events a test sends: Read returns them in
// order, and ringbuf.ErrFlushed where a Flush was asked, as the ring
// buffer's reader does; os.ErrClosed once closed.
type script struct {
	mu     sync.Mutex
	more   *sync.Cond
	queue  []*tracer.Event // nil: a flush
	losses schema.Losses
	closed bool
	// driverOff are the processes whose driver view is off: the calls
	// sent for them since are counted, not read.
	driverOff map[uint32]uint64
}

func newScript() *script {
	s := &script{}
	s.more = sync.NewCond(&s.mu)
	return s
}

func (s *script) send(evs ...tracer.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range evs {
		if _, off := s.driverOff[evs[i].PID]; off && evs[i].Op != memory.OpTensorAlloc && evs[i].Op != memory.OpTensorFree {
			s.driverOff[evs[i].PID]++
			continue
		}
		s.queue = append(s.queue, &evs[i])
	}
	s.more.Broadcast()
}

func (s *script) Read(ev *tracer.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) == 0 && !s.closed {
		s.more.Wait()
	}
	if s.closed {
		return os.ErrClosed
	}
	next := s.queue[0]
	s.queue = s.queue[1:]
	if next == nil {
		return ringbuf.ErrFlushed
	}
	*ev = *next
	return nil
}

func (s *script) Flush() error {
	s.send()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, nil)
	s.more.Broadcast()
	return nil
}

func (s *script) Losses() (schema.Losses, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.losses, nil
}

func (s *script) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.more.Broadcast()
	return nil
}

func (s *script) Attach(string) ([]string, error) {
	return nil, errors.New("a script attaches nothing")
}
func (s *script) AttachAllocator(string, uint32) (*tracer.AllocatorProbes, error) {
	return nil, errors.New("a script attaches nothing")
}
func (s *script) AttachOOMReport(string) (io.Closer, error) {
	return nil, errors.New("a script attaches nothing")
}
func (s *script) AddPython(uint32, tracer.PythonWalk) error { return nil }
func (s *script) RemovePython(uint32)                       {}
func (s *script) SwitchDriverOff(pid uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.driverOff == nil {
		s.driverOff = map[uint32]uint64{}
	}
	s.driverOff[pid] = 0
	return nil
}
func (s *script) DriverCallsOff(pid uint32) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.driverOff[pid]
	return n, ok
}
func (s *script) TensorProbeStats() (uint64, time.Duration, error) {
	return 0, 0, nil
}

func opNamed(t *testing.T, symbol string) memory.Op {
	t.Helper()
	for op := range memory.Op(64) {
		if op.Symbol() == symbol {
			return op
		}
	}
	t.Fatalf("no %s", symbol)
	return 0
}

// TestRunReadsEveryEvent: Run reads the source's events into the books;
// Sync returns once every event sent before it is accounted; stopped, Run
// reads what is left, keeps the source's last loss counts and closes it,
// and the books are still read after.
func TestRunReadsEveryEvent(t *testing.T) {
	src := newScript()
	self := os.Getpid() // a process that lives: not released as vanished
	p := newProfiler(Config{ProcRoot: "/proc", PIDs: []int{self}, Log: logs.To(func(l logs.Line) { t.Log(l.Msg) })}, src)
	p.startJobs()
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	alloc, free := opNamed(t, "cuMemAlloc_v2"), opNamed(t, "cuMemFree_v2")
	pid := uint32(self)
	src.send(
		tracer.Event{Op: alloc, PID: pid, TID: pid, Comm: "trainer", Address: 0x1000, Bytes: 4096, Timestamp: 1, Stack: []uint64{0x401000}},
		tracer.Event{Op: alloc, PID: pid, TID: pid, Comm: "trainer", Address: 0x2000, Bytes: 8192, Timestamp: 2, Stack: []uint64{0x401000}},
		tracer.Event{Op: free, PID: pid, TID: pid, Comm: "trainer", Address: 0x1000, Timestamp: 3},
	)
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	want := accounting.Counters{AllocBytes: 12288, AllocCount: 2, FreeBytes: 4096, FreeCount: 1}
	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	rows := s.Rows()
	if len(rows) != 1 || rows[0].Counters != want || rows[0].Comm != "trainer" || s.Events != 3 {
		t.Fatalf("rows %+v after %d events, want one of %+v", rows, s.Events, want)
	}

	src.send(tracer.Event{Op: free, PID: pid, TID: pid, Comm: "trainer", Address: 0x2000, Timestamp: 4})
	src.mu.Lock()
	src.losses[schema.RingBufferFull] = 2
	src.mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if !src.closed {
		t.Error("the source is not closed")
	}
	after, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if rows := after.Rows(); len(rows) != 1 || rows[0].LiveBytes() != 0 || after.Events != 4 || after.Losses[schema.RingBufferFull] != 2 {
		t.Errorf("after the stop: rows %+v, %d events, losses %v", rows, after.Events, after.Losses)
	}
}

func (s *script) LostBytes() (uint64, error)      { return 0, nil }
func (s *script) JournalBytes() int64             { return 0 }
func (s *script) Compact(tracer.Compaction) error { return nil }
