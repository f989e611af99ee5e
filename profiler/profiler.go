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

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/discover"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pystack"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// ErrNoProcess is returned by New for a requested process that does not exist.
var ErrNoProcess = errors.New("no process with pid")

// Config says what to trace.
type Config struct {
	// NoTensors leaves PyTorch's caching allocator alone: the driver view
	// only, without the probes' cost on every tensor.
	NoTensors bool
	// TensorNativeStacks walks the whole native stack of every tensor, where
	// by default a tensor with Python frames keeps the allocator's frame.
	TensorNativeStacks bool
	// Object, when set, is the BPF object to load (program.bpf.c built
	// elsewhere, as in a gadget image) instead of the one built in.
	Object []byte
	// Library, when set, is the only driver library attached; discovery is
	// off: PyTorch's allocators and Python interpreters are looked for in the
	// processes that map this library only.
	Library string
	// DriverDirs are where installed driver libraries are looked for, to
	// trace processes from their first call; discover.DriverDirs by default.
	DriverDirs []string
	// PIDs, when set, limits tracing and discovery to these processes.
	PIDs []int
	// GPUs, when set, limits reports to memory on these device ordinals.
	GPUs []int
	// GPUDir is where the NVIDIA driver describes its GPUs; gpuinfo.DriverDir
	// by default.
	GPUDir string
	// Pods names the pods and containers of the node (k8smeta.Pods), when
	// an API server is known.
	Pods container.Namer
	// ProcRoot is where processes are read from; /proc by default.
	ProcRoot string
	// ScanInterval is how often /proc is scanned for new driver libraries
	// and exited processes; 500ms by default.
	ScanInterval time.Duration
	// Logf receives progress messages (attachments, waiting); may be nil.
	Logf func(format string, args ...any)
	// OnOOM, when set, receives each out-of-memory snapshot as it is taken,
	// from the goroutine that reads events: it should not block for long.
	OnOOM func(OOM)
	// Timeline keeps each process's live bytes per GPU and view over time,
	// for Report.Timeline (gpumem record's HTML report): bounded memory
	// (accounting.TimelineBuckets), a few comparisons per event.
	Timeline bool
}

// Profiler is safe for concurrent use: Run in one goroutine, Report and
// Sync from others. Run reads the events on one goroutine into the books,
// which reads no file: what takes files or waits is done on goroutines of
// their own, each woken by a signal: reading new processes (procs.go),
// naming stacks (resolve), delivering out-of-memory snapshots (oom.go),
// and, every ScanInterval, scanning /proc for libraries and processes. One
// read stays on the event path: the names of a Python process's code
// objects, from its memory, for a stack seen for the first time, since the
// process may be gone a moment later (each code object is read once).
type Profiler struct {
	cfg Config
	tr  *tracer.Tracer
	sym *symbolize.Symbolizer
	py  *pystack.Resolver
	// notPython are processes mapping Python files that are not Python
	// processes gpu-mem can walk; not retried while they live.
	notPython map[int]bool
	watching  map[int]bool // commands Watch waits for
	// driverID is Config.Library's file (discover.FileID): the processes
	// that map it are the only ones scanned.
	driverID string

	mu         sync.Mutex
	oomPending []oomSnapshot // taken, not yet delivered
	ooms       []OOM         // delivered, the latest MaxOOMs
	lastOOM    map[uint32]oomMark
	ledger     *accounting.Ledger
	stacks     stackTable
	keyBuf     []byte // intern's, reused
	pidStacks  map[uint32][]accounting.StackID
	unresolved []accounting.StackID // interned since the last resolve
	resolveNow chan struct{}        // to the goroutine that resolves
	resolving  sync.Mutex           // one resolve at a time
	oomNow     chan struct{}        // to the goroutine that delivers OOMs
	delivering sync.Mutex           // OOMs delivered in order, once
	// The process table's (procs.go): processes to read, and to register
	// as Python processes, off the event path.
	toEnrich    []uint32
	pyAsked     map[uint32]bool
	enrichNow   chan struct{}
	enriching   sync.Mutex // one enrichNoted at a time
	registering sync.Mutex // one Python registration at a time
	comms       map[uint32]string
	events      uint64
	attached    map[string]discover.Library
	failed      map[string]error // libraries whose attach failed, logged once
	pyStats     PythonStats
	// allocations whose native stack was cut at the depth limit
	nativeTruncated uint64
	frameTable      frameTable                        // each distinct frame of named stacks, once
	devices         []gpuinfo.Device                  // the driver's GPUs
	ordinals        map[uint32]map[int]gpuinfo.Device // each process's CUDA ordinals
	containers      map[uint32]container.Identity     // each process's pod and container
	// Exited processes, dropped as intervals begin (exited.go).
	clock      uint64            // counts exits and intervals begun: orders them
	exitedAt   map[uint32]uint64 // processes that exited, when (clock)
	intervalAt uint64            // when the current interval began (clock); 0: none yet
	byPeaks    bool              // intervals begin at IntervalPeaks
	unlisted   map[uint32]bool   // processes with rows the latest EachRow left out
	flushes    uint64
	flushed    *sync.Cond
	// losses are the tracer's last counts, kept when it is closed.
	losses schema.Losses
	closed bool
}

// New loads the tracer. It fails with tracer.ErrPermission when BPF is
// refused, and when a requested process does not exist.
func New(cfg Config) (*Profiler, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.GPUDir == "" {
		cfg.GPUDir = gpuinfo.DriverDir
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
	load := tracer.New
	if cfg.Object != nil {
		load = func(opts tracer.Options) (*tracer.Tracer, error) { return tracer.NewFromObject(cfg.Object, opts) }
	}
	tr, err := load(tracer.Options{PIDs: pids, TensorNativeStacks: cfg.TensorNativeStacks})
	if err != nil {
		return nil, err
	}
	p := &Profiler{
		cfg:        cfg,
		tr:         tr,
		sym:        symbolize.New(cfg.ProcRoot),
		py:         pystack.NewResolver(),
		notPython:  map[int]bool{},
		watching:   map[int]bool{},
		ledger:     accounting.New(),
		stacks:     newStackTable(),
		pidStacks:  map[uint32][]accounting.StackID{},
		resolveNow: make(chan struct{}, 1),
		enrichNow:  make(chan struct{}, 1),
		oomNow:     make(chan struct{}, 1),
		pyAsked:    map[uint32]bool{},
		comms:      map[uint32]string{},
		attached:   map[string]discover.Library{},
		failed:     map[string]error{},
		lastOOM:    map[uint32]oomMark{},
		devices:    gpuinfo.Devices(cfg.GPUDir),
		frameTable: newFrameTable(),
		ordinals:   map[uint32]map[int]gpuinfo.Device{},
		containers: map[uint32]container.Identity{},
		exitedAt:   map[uint32]uint64{},
	}
	p.flushed = sync.NewCond(&p.mu)
	p.sayMissingCapabilities()
	if cfg.Timeline {
		p.ledger.StartTimeline(bpfNow())
	}
	if cfg.Library != "" {
		if err := p.attach(discover.Library{Path: cfg.Library}); err != nil {
			tr.Close()
			return nil, err
		}
		if p.driverID, err = discover.FileID(cfg.Library); err != nil {
			tr.Close()
			return nil, err
		}
	} else {
		p.attachInstalled()
	}
	return p, nil
}

// attachInstalled attaches to the driver libraries installed on the node,
// before any process loads them: uprobes hold on the file, so a program
// started later is traced from its first driver call (its contexts, and so
// its GPU, included), where discovery would see it only at the next scan.
// The host's file system is searched too when the node's process 1 is
// readable (a DaemonSet with hostPID).
func (p *Profiler) attachInstalled() {
	dirs := p.cfg.DriverDirs
	if dirs == nil {
		dirs = discover.DriverDirs
	}
	roots := []string{"/"}
	if host := filepath.Join(p.cfg.ProcRoot, "1", "root"); readableDir(host) {
		roots = append(roots, host)
	}
	for _, lib := range discover.Installed(roots, dirs) {
		if !p.shouldAttach(lib) {
			continue
		}
		if err := p.attach(lib); err != nil {
			p.cfg.Logf("%v (installed; processes that load it are attached when found)", err)
		}
	}
}

func readableDir(path string) bool {
	_, err := os.ReadDir(path)
	return err == nil
}

// Run traces until ctx is done, then reads the events still buffered and
// releases the tracer.
func (p *Profiler) Run(ctx context.Context) error {
	defer p.tr.Close()
	readErr := make(chan error, 1)
	go func() { readErr <- p.readEvents() }()

	// New stacks are named at every scan, and as soon as a batch of them
	// is waiting, not only when a report asks: their raw frames are kept
	// no longer than that, whatever the interval between reports. In a
	// goroutine of its own, since loading a large library's symbols must
	// not hold up the scans that attach, nor the events.
	go onSignal(ctx, p.resolveNow, p.resolve)
	// What the event path must not wait for, each on a goroutine of its
	// own: reading new processes (procs.go), and delivering out-of-memory
	// snapshots, which names their stacks and has files written.
	go onSignal(ctx, p.enrichNow, p.enrichNoted)
	go onSignal(ctx, p.oomNow, p.deliverOOMs)

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
			p.askResolve()
		}
	}
}

// signal signals ch unless a signal is waiting there already.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// onSignal runs f at each signal on ch, until ctx is done.
func onSignal(ctx context.Context, ch <-chan struct{}, f func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			f()
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

// Sync returns once every event sent before the call has been accounted,
// their processes read and the out-of-memory snapshots they took
// delivered.
func (p *Profiler) Sync() error {
	if err := p.flush(); err != nil {
		return err
	}
	p.enrichNoted()
	p.deliverOOMs()
	return nil
}

// flush returns once every event sent before the call has been read.
func (p *Profiler) flush() error {
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
		if p.handle(&ev) {
			signal(p.oomNow) // delivered off the event path
		}
	}
}

// handle accounts one event; true when it took an out-of-memory snapshot.
func (p *Profiler) handle(ev *tracer.Event) (oom bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events++
	if ev.Exit {
		p.forget(ev.PID, ev.Timestamp)
		return false
	}
	p.noteProcess(ev.PID, ev.Comm)
	switch {
	case ev.Op.IsFree():
		p.ledger.Free(ev.PID, ev.Op, ev.Address, ev.Timestamp)
	case ev.Op.IsRetain():
		p.ledger.Retain(ev.PID, ev.Address)
	case ev.Result == memory.CUDASuccess:
		p.countStacks(ev)
		p.ledger.Alloc(p.key(ev), ev.Address, ev.Op.Space(), ev.Bytes, ev.Timestamp)
	default:
		p.countStacks(ev)
		k := p.key(ev)
		p.ledger.Fail(k, ev.Op, ev.Result, ev.Bytes)
		if ev.Result == memory.CUDAOutOfMemory {
			p.takeOOM(accounting.FailureKey{Key: k, Op: ev.Op, Result: ev.Result}, ev.Bytes)
			return true
		}
	}
	return false
}

// key is the row an allocation event goes to. Host and managed memory do
// not live on the device of the context they were made in.
func (p *Profiler) key(ev *tracer.Event) accounting.Key {
	k := accounting.Key{PID: ev.PID, Stack: p.intern(ev), Kind: ev.Op.Kind(), Device: ev.Device}
	if k.Kind == memory.KindHost || k.Kind == memory.KindManaged {
		k.Device = memory.DeviceUnknown
	}
	return k
}

// PythonStats count how the Python frames of allocation events were read.
type PythonStats struct {
	Processes uint64 `json:"processes"` // Python processes registered
	Events    uint64 `json:"events"`    // allocation events from them
	// Missing are their events without Python frames: from threads with
	// no Python thread state, or sent before the process was registered.
	Missing    uint64 `json:"missing"`
	NoThread   uint64 `json:"no_thread"`   // no thread state for the calling thread
	Truncated  uint64 `json:"truncated"`   // deeper than 128 frames: outermost dropped
	ReadErrors uint64 `json:"read_errors"` // the frame chain broke while read
}

// countStacks counts how whole an allocation event's stacks are: native
// ones cut at the depth limit, and the Python frames of a Python process,
// which is registered (askPython) if the scans have not yet.
func (p *Profiler) countStacks(ev *tracer.Event) {
	if ev.Flags&tracer.NativeTruncated != 0 {
		p.nativeTruncated++
	}
	if !p.py.Has(ev.PID) {
		p.askPython(ev.PID)
		return
	}
	s := &p.pyStats
	s.Events++
	if len(ev.PyFrames) == 0 {
		s.Missing++
	}
	if ev.Flags&tracer.PyNoThread != 0 {
		s.NoThread++
	}
	if ev.Flags&tracer.PyTruncated != 0 {
		s.Truncated++
	}
	if ev.Flags&tracer.PyReadError != 0 {
		s.ReadErrors++
	}
}

// forget releases what a process that exited at time ts held, and what is
// kept to walk its Python frames. Its rows, stacks and mappings stay until
// it is dropped (exited.go): its stacks are symbolized at the next report.
func (p *Profiler) forget(pid uint32, ts uint64) {
	p.ledger.Exit(pid, ts)
	p.exited(pid)
	delete(p.lastOOM, pid)
	if p.py.Has(pid) {
		p.py.Forget(pid)
		p.tr.RemovePython(pid)
	}
	delete(p.notPython, int(pid))
}

// intern returns the ID of the event's stack.
func (p *Profiler) intern(ev *tracer.Event) accounting.StackID {
	// The key is built in a reused buffer; only a new stack's key is kept,
	// until the stack is named.
	k := stackKey(p.keyBuf[:0], ev)
	p.keyBuf = k
	id, check, found := p.stacks.lookup(k)
	if found {
		return id
	}
	p.stacks.add(id, check, &rawStack{key: string(k), op: ev.Op, python: p.py.Frames(ev.PID, ev.PyFrames)})
	p.pidStacks[ev.PID] = append(p.pidStacks[ev.PID], id)
	p.unresolved = append(p.unresolved, id)
	if len(p.unresolved)%resolveBatch == 0 {
		p.askResolve()
	}
	return id
}

// askResolve has the stacks waiting named, unless they are being named.
func (p *Profiler) askResolve() {
	signal(p.resolveNow)
}

// SymbolStats are what the symbol tables hold: the agent reports their
// share of its memory.
func (p *Profiler) SymbolStats() symbolize.Stats { return p.sym.Stats() }

// scan registers Python processes, attaches to driver libraries that
// appeared, and releases the memory of traced processes that are gone
// without their exit being seen.
func (p *Profiler) scan(first bool) {
	p.releaseVanished()
	found, err := discover.ScanUsing(p.cfg.ProcRoot, p.cfg.PIDs, p.driverID)
	if err != nil {
		p.cfg.Logf("scan processes: %v", err)
		return
	}
	for _, pid := range found.Python {
		p.addPython(pid)
	}
	drivers := 0
	for _, lib := range found.Libraries {
		if !lib.Allocator {
			drivers++
		}
		if !p.shouldAttach(lib) {
			continue
		}
		if err := p.attach(lib); err != nil && p.failed[lib.ID()] == nil {
			p.failed[lib.ID()] = err
			if errors.Is(err, tracer.ErrNoProbes) {
				p.cfg.Logf("%v: no tensor view for it, the driver view goes on", err)
			} else {
				p.cfg.Logf("%v (retrying)", err)
			}
		}
	}
	if first && drivers == 0 && p.cfg.Library == "" {
		p.cfg.Logf("waiting for a process to load libcuda.so (scanning every %v)", p.cfg.ScanInterval)
	}
}

// shouldAttach says whether a library found by a scan is to be attached:
// not yet attached, not the driver when --library names it (allocators are
// still found), not an allocator with the tensor view off or without probes.
func (p *Profiler) shouldAttach(lib discover.Library) bool {
	if _, ok := p.attached[lib.ID()]; ok {
		return false
	}
	if p.cfg.Library != "" && !lib.Allocator || p.cfg.NoTensors && lib.Allocator {
		return false
	}
	return !errors.Is(p.failed[lib.ID()], tracer.ErrNoProbes)
}

func (p *Profiler) attach(lib discover.Library) error {
	what := "driver functions"
	var n int
	var err error
	if lib.Allocator {
		what = "PyTorch allocator probes"
		n, err = p.tr.AttachAllocator(lib.Path)
	} else {
		var symbols []string
		symbols, err = p.tr.Attach(lib.Path)
		n = len(symbols)
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.attached[lib.ID()] = lib
	p.mu.Unlock()
	p.cfg.Logf("attached to %s: %d %s", lib.Path, n, what)
	return nil
}

func (p *Profiler) releaseVanished() {
	p.mu.Lock()
	pids := p.ledger.LivePIDs()
	for pid := range p.notPython {
		pids = append(pids, uint32(pid))
	}
	p.mu.Unlock()
	var vanished []uint32
	for _, pid := range pids {
		if gone(p.cfg.ProcRoot, int(pid)) {
			vanished = append(vanished, pid)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pid := range vanished {
		p.forget(pid, bpfNow()) // seen gone now
	}
}

// resolveBatch: every so many new stacks, besides every scan, the resolver
// is asked to name them, so that a burst of new stacks does not hold all of
// its raw frames until the next scan.
const resolveBatch = 1024

// resolve names the native frames of the stacks interned since it last
// ran, and drops their raw frames. The symbol tables are read without
// holding p.mu, so that events keep flowing.
func (p *Profiler) resolve() {
	p.resolving.Lock()
	defer p.resolving.Unlock()
	p.mu.Lock()
	todo := p.unresolved
	p.unresolved = nil
	p.mu.Unlock()
	// In batches: a batch's frames are copies until interned.
	const batch = resolveBatch
	raws := make([]*rawStack, 0, min(batch, len(todo)))
	named := make([][]symbolize.Frame, 0, cap(raws))
	for len(todo) > 0 {
		ids := todo[:min(batch, len(todo))]
		todo = todo[len(ids):]
		raws, named = raws[:0], named[:0]
		p.mu.Lock()
		for _, id := range ids {
			raws = append(raws, p.stacks.m[id].raw)
		}
		p.mu.Unlock()
		for _, r := range raws {
			var frames []symbolize.Frame
			if r != nil {
				frames = pystack.Merge(p.sym.Frames(r.pid(), r.native()), r.python)
			}
			named = append(named, frames)
		}
		p.storeFrames(ids, raws, named)
	}
}

// storeFrames keeps the named frames of stacks, unless a stack was dropped
// (and its ID perhaps taken again) while they were read.
func (p *Profiler) storeFrames(ids []accounting.StackID, raws []*rawStack, named [][]symbolize.Frame) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, id := range ids {
		if s, ok := p.stacks.m[id]; ok && raws[i] != nil && s.raw == raws[i] {
			s.frames = p.internFrames(s.raw.op, named[i])
			s.raw = nil // named now
			p.stacks.m[id] = s
		}
	}
}

// internFrames returns the stack's frames, after the driver function's, as
// indices in the frame table, referenced until the stack is dropped.
func (p *Profiler) internFrames(op memory.Op, frames []symbolize.Frame) []uint32 {
	out := make([]uint32, 0, len(frames)+1)
	out = append(out, p.frameTable.intern(driverFrame(op)))
	for _, f := range frames {
		out = append(out, p.frameTable.intern(f))
	}
	return out
}

// driverFrame is the frame of the driver function a stack ends in.
func driverFrame(op memory.Op) symbolize.Frame {
	return symbolize.Frame{Function: op.Symbol(), Module: "libcuda.so.1"}
}
