package profiler

import (
	"io"
	"time"

	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Source is where the profiler's events come from and what it attaches
// probes and registers processes through: the tracer (*tracer.Tracer) in
// every command, a scripted one in the profiler's own tests.
type Source interface {
	// Read waits for the next event; ringbuf.ErrFlushed once every event
	// sent before a Flush was read, os.ErrClosed once closed.
	Read(ev *tracer.Event) error
	Flush() error
	// Losses are the events lost so far, by cause.
	Losses() (schema.Losses, error)
	// LostBytes are the bytes of the driver allocations among them.
	LostBytes() (uint64, error)
	// Attach puts the driver's probes on the library at path, returning
	// the functions attached.
	Attach(path string) ([]string, error)
	// AttachAllocator puts the tensor probes on PyTorch's allocator library
	// at path, for process pid (every process: 0).
	AttachAllocator(path string, pid uint32) (*tracer.AllocatorProbes, error)
	// AttachOOMReport probes the out-of-memory report of PyTorch's
	// allocator library at path, in every process.
	AttachOOMReport(path string) (io.Closer, error)
	AddPython(pid uint32, walk tracer.PythonWalk) error
	RemovePython(pid uint32)
	// SwitchDriverOff stops tracing process pid's driver calls, which
	// DriverCallsOff then counts.
	SwitchDriverOff(pid uint32) error
	DriverCallsOff(pid uint32) (uint64, bool)
	// TensorProbeStats are the tensor probes' runs and run time.
	TensorProbeStats() (runs uint64, runtime time.Duration, err error)
	// JournalBytes is the size of the journal of the state kept
	// (Config.StateDir), and Compact compacts it, from Read's goroutine.
	JournalBytes() int64
	Compact(tracer.Compaction) error
	Close() error
}

var _ Source = (*tracer.Tracer)(nil)
