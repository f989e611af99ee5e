// Package profiler runs the pipeline from driver calls to books: it attaches
// the tracer to every CUDA driver library it discovers, reads the calls,
// interns and symbolizes their stacks, and keeps the ledger.
package profiler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/discover"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// ErrNoProcess is returned by New for a requested process that does not exist.
var ErrNoProcess = errors.New("no process with pid")

// Config says what to trace.
type Config struct {
	// Library, when set, is the only driver library attached; discovery is off.
	Library string
	// PIDs, when set, limits tracing and discovery to these processes.
	PIDs []int
	// ProcRoot is where processes are read from; /proc by default.
	ProcRoot string
	// ScanInterval is how often /proc is scanned for new driver libraries
	// and exited processes; 500ms by default.
	ScanInterval time.Duration
	// Logf receives progress messages (attachments, waiting); may be nil.
	Logf func(format string, args ...any)
}

// Profiler is safe for concurrent use: Run in one goroutine, Report and
// Sync from others.
type Profiler struct {
	cfg Config
	tr  *tracer.Tracer
	sym *symbolize.Symbolizer

	mu       sync.Mutex
	ledger   *accounting.Ledger
	stacks   []Stack // by accounting.StackID
	stackIDs map[string]accounting.StackID
	comms    map[uint32]string
	events   uint64
	attached map[string]discover.Library
	failed   map[string]bool // libraries whose attach failed, logged once
	flushes  uint64
	flushed  *sync.Cond
	// losses are the tracer's last counts, kept when it is closed.
	losses tracer.Losses
	closed bool
}

// Stack is an interned call stack of one process.
type Stack struct {
	PID    uint32
	Frames []symbolize.Frame // innermost first: the driver function, then its callers
}

// New loads the tracer. It fails with tracer.ErrPermission when BPF is
// refused, and when a requested process does not exist.
func New(cfg Config) (*Profiler, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.ScanInterval == 0 {
		cfg.ScanInterval = 500 * time.Millisecond
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	pids := make([]uint32, 0, len(cfg.PIDs))
	for _, pid := range cfg.PIDs {
		if _, err := os.Stat(filepath.Join(cfg.ProcRoot, strconv.Itoa(pid))); pid <= 0 || err != nil {
			return nil, fmt.Errorf("%w %d", ErrNoProcess, pid)
		}
		pids = append(pids, uint32(pid))
	}
	tr, err := tracer.New(tracer.Options{PIDs: pids})
	if err != nil {
		return nil, err
	}
	p := &Profiler{
		cfg:      cfg,
		tr:       tr,
		sym:      symbolize.New(cfg.ProcRoot),
		ledger:   accounting.New(),
		stackIDs: map[string]accounting.StackID{},
		comms:    map[uint32]string{},
		attached: map[string]discover.Library{},
		failed:   map[string]bool{},
	}
	p.flushed = sync.NewCond(&p.mu)
	if cfg.Library != "" {
		if err := p.attach(discover.Library{Path: cfg.Library}); err != nil {
			tr.Close()
			return nil, err
		}
	}
	return p, nil
}

// Run traces until ctx is done, then reads the events still buffered and
// releases the tracer.
func (p *Profiler) Run(ctx context.Context) error {
	defer p.tr.Close()
	readErr := make(chan error, 1)
	go func() { readErr <- p.readEvents() }()

	p.scan(true)
	ticker := time.NewTicker(p.cfg.ScanInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return p.drain(readErr)
		case err := <-readErr:
			return fmt.Errorf("read events: %w", err)
		case <-ticker.C:
			p.scan(false)
		}
	}
}

// drain reads every event sent before the stop, and keeps the final loss
// counts for Report.
func (p *Profiler) drain(readErr chan error) error {
	if err := p.Sync(); err != nil {
		return err
	}
	losses, err := p.tr.Losses()
	p.mu.Lock()
	p.losses, p.closed = losses, true
	p.mu.Unlock()
	if err != nil {
		return err
	}
	p.tr.Close()
	if err := <-readErr; !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("read events: %w", err)
	}
	return nil
}

// Sync returns once every event sent before the call has been accounted.
func (p *Profiler) Sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	target := p.flushes + 1
	if err := p.tr.Flush(); err != nil {
		return fmt.Errorf("flush ring buffer: %w", err)
	}
	for p.flushes < target {
		p.flushed.Wait()
	}
	return nil
}

func (p *Profiler) readEvents() error {
	var ev tracer.Event
	for {
		err := p.tr.Read(&ev)
		switch {
		case errors.Is(err, ringbuf.ErrFlushed):
			p.mu.Lock()
			p.flushes++
			p.flushed.Broadcast()
			p.mu.Unlock()
			continue
		case errors.Is(err, os.ErrClosed):
			return err
		case err != nil:
			return err
		}
		p.handle(&ev)
	}
}

func (p *Profiler) handle(ev *tracer.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events++
	if ev.Exit {
		p.ledger.Exit(ev.PID)
		p.sym.Forget(ev.PID)
		return
	}
	p.comms[ev.PID] = ev.Comm
	switch {
	case ev.Op.IsFree() && ev.Result == tracer.CUDASuccess:
		p.ledger.Free(ev.PID, ev.Address, ev.Op.Handles(), ev.Timestamp)
	case ev.Op.IsFree():
		p.ledger.FailedFree()
	case ev.Result == tracer.CUDASuccess:
		key := accounting.Key{PID: ev.PID, Stack: p.intern(ev), Kind: ev.Op.Kind()}
		p.ledger.Alloc(key, ev.Address, ev.Op.Handles(), ev.Bytes, ev.Timestamp)
	default:
		key := accounting.Key{PID: ev.PID, Stack: p.intern(ev), Kind: ev.Op.Kind()}
		p.ledger.Fail(key, ev.Op, ev.Result, ev.Bytes)
	}
}

// intern returns the ID of the event's stack, symbolizing it the first time
// it is seen, while the process is alive to be read.
func (p *Profiler) intern(ev *tracer.Event) accounting.StackID {
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ev.Stack))), len(ev.Stack)*8)
	key := fmt.Sprintf("%d/%d/%s", ev.PID, ev.Op, raw)
	if id, ok := p.stackIDs[key]; ok {
		return id
	}
	driver := symbolize.Frame{Function: ev.Op.Symbol(), Module: "libcuda.so.1"}
	frames := append([]symbolize.Frame{driver}, p.sym.Frames(ev.PID, ev.Stack)...)
	id := accounting.StackID(len(p.stacks))
	p.stacks = append(p.stacks, Stack{PID: ev.PID, Frames: frames})
	p.stackIDs[key] = id
	return id
}

// scan attaches to driver libraries that appeared, and releases the memory
// of traced processes that are gone without their exit being seen.
func (p *Profiler) scan(first bool) {
	p.releaseVanished()
	if p.cfg.Library != "" {
		return
	}
	libs, err := discover.Scan(p.cfg.ProcRoot, p.cfg.PIDs)
	if err != nil {
		p.cfg.Logf("scan processes: %v", err)
		return
	}
	for _, lib := range libs {
		if _, ok := p.attached[lib.ID()]; ok {
			continue
		}
		if err := p.attach(lib); err != nil && !p.failed[lib.ID()] {
			p.failed[lib.ID()] = true
			p.cfg.Logf("%v (retrying)", err)
		}
	}
	if first && len(libs) == 0 {
		p.cfg.Logf("waiting for a process to load libcuda.so (scanning every %v)", p.cfg.ScanInterval)
	}
}

func (p *Profiler) attach(lib discover.Library) error {
	symbols, err := p.tr.Attach(lib.Path)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.attached[lib.ID()] = lib
	p.mu.Unlock()
	p.cfg.Logf("attached to %s: %d driver functions", lib.Path, len(symbols))
	return nil
}

func (p *Profiler) releaseVanished() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pid := range p.ledger.LivePIDs() {
		if _, err := os.Stat(filepath.Join(p.cfg.ProcRoot, strconv.Itoa(int(pid)))); errors.Is(err, os.ErrNotExist) {
			p.ledger.Exit(pid)
			p.sym.Forget(pid)
		}
	}
}
