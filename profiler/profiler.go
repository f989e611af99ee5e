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
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/discover"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
	"github.com/gpu-mem/gpu-mem/pystack"
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
	// Pods names the pods of the node, when an API server is known.
	Pods *k8smeta.Pods
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
// Sync from others.
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
	comms      map[uint32]string
	events     uint64
	attached   map[string]discover.Library
	failed     map[string]error // libraries whose attach failed, logged once
	pyStats    PythonStats
	frameTable frameTable                        // each distinct frame of named stacks, once
	devices    []gpuinfo.Device                  // the driver's GPUs
	ordinals   map[uint32]map[int]gpuinfo.Device // each process's CUDA ordinals
	containers map[uint32]k8smeta.Container      // each process's pod and container
	flushes    uint64
	flushed    *sync.Cond
	// losses are the tracer's last counts, kept when it is closed.
	losses tracer.Losses
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
		comms:      map[uint32]string{},
		attached:   map[string]discover.Library{},
		failed:     map[string]error{},
		lastOOM:    map[uint32]oomMark{},
		devices:    gpuinfo.Devices(cfg.GPUDir),
		frameTable: newFrameTable(),
		ordinals:   map[uint32]map[int]gpuinfo.Device{},
		containers: map[uint32]k8smeta.Container{},
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
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.resolveNow:
				p.resolve()
			}
		}
	}()

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
		if p.handle(&ev) {
			p.deliverOOMs()
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
	if _, seen := p.comms[ev.PID]; !seen {
		p.ordinals[ev.PID] = gpuinfo.Ordinals(p.devices, p.environ(ev.PID))
		p.containers[ev.PID] = k8smeta.ForProcess(p.cfg.ProcRoot, int(ev.PID))
	}
	p.comms[ev.PID] = ev.Comm
	switch {
	case ev.Op.IsFree():
		p.ledger.Free(ev.PID, ev.Op, ev.Address, ev.Timestamp)
	case ev.Op.IsRetain():
		p.ledger.Retain(ev.PID, ev.Address)
	case ev.Result == tracer.CUDASuccess:
		p.countPython(ev)
		p.ledger.Alloc(p.key(ev), ev.Address, ev.Op.Space(), ev.Bytes, ev.Timestamp)
	default:
		p.countPython(ev)
		k := p.key(ev)
		p.ledger.Fail(k, ev.Op, ev.Result, ev.Bytes)
		if ev.Result == tracer.CUDAOutOfMemory {
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
	if k.Kind == tracer.KindHost || k.Kind == tracer.KindManaged {
		k.Device = tracer.DeviceUnknown
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

// countPython counts an allocation event of a Python process, registering
// the process now if the scans have not yet.
func (p *Profiler) countPython(ev *tracer.Event) {
	if !p.py.Has(ev.PID) && !p.addPython(int(ev.PID)) {
		return
	}
	s := &p.pyStats
	s.Events++
	if len(ev.PyFrames) == 0 {
		s.Missing++
	}
	if ev.PyFlags&tracer.PyNoThread != 0 {
		s.NoThread++
	}
	if ev.PyFlags&tracer.PyTruncated != 0 {
		s.Truncated++
	}
	if ev.PyFlags&tracer.PyReadError != 0 {
		s.ReadErrors++
	}
}

// addPython registers a Python process with the BPF program and the
// resolver; false when pid is not one (yet).
func (p *Profiler) addPython(pid int) bool {
	if p.notPython[pid] {
		return false
	}
	proc, err := pystack.Detect(p.cfg.ProcRoot, pid)
	switch {
	case errors.Is(err, pystack.ErrNotReady):
		return false
	case errors.Is(err, pystack.ErrNotPython) && p.watching[pid]:
		return false // not yet: a command between fork and exec
	case errors.Is(err, pystack.ErrNotPython):
		p.notPython[pid] = true
		return false
	case err != nil:
		p.notPython[pid] = true
		p.cfg.Logf("no Python frames for %v", err)
		return false
	}
	if err := p.tr.AddPython(uint32(pid), proc.Walk()); err != nil {
		p.cfg.Logf("%v", err)
		return false
	}
	if err := p.py.Add(proc); err != nil {
		p.tr.RemovePython(uint32(pid))
		p.cfg.Logf("pid %d: %v", pid, err)
		return false
	}
	p.pyStats.Processes++
	p.cfg.Logf("pid %d: Python %s frames", pid, proc.Version)
	return true
}

// forget releases what a process that exited at time ts held, and what is
// kept to walk its Python frames. Its mappings stay until DropExited: its
// stacks are symbolized at the next report.
func (p *Profiler) forget(pid uint32, ts uint64) {
	p.ledger.Exit(pid, ts)
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
	p.sym.Track(ev.PID)
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
	select {
	case p.resolveNow <- struct{}{}:
	default:
	}
}

// DropExited forgets the processes that exited: their rows, failures and
// stacks. Reports taken before keep them. A process with a stack still
// being named is kept until a later call: EachRow has not listed that
// stack's row yet.
func (p *Profiler) DropExited() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pid := range p.ledger.DropExited(p.naming) {
		for _, id := range p.pidStacks[pid] {
			p.frameTable.release(p.stacks.m[id].frames)
			p.stacks.drop(id)
		}
		delete(p.pidStacks, pid)
		delete(p.comms, pid)
		delete(p.ordinals, pid)
		delete(p.containers, pid)
		p.sym.Forget(pid)
	}
}

// SymbolStats are what the symbol tables hold: the agent reports their
// share of its memory.
func (p *Profiler) SymbolStats() symbolize.Stats { return p.sym.Stats() }

// naming says whether a process has stacks not yet named.
func (p *Profiler) naming(pid uint32) bool {
	for _, id := range p.pidStacks[pid] {
		if !p.stacks.m[id].named() {
			return true
		}
	}
	return false
}

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
	p.mu.Lock()
	for _, pid := range found.Python {
		if !p.py.Has(uint32(pid)) {
			p.addPython(pid)
		}
	}
	p.mu.Unlock()
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
	defer p.mu.Unlock()
	pids := p.ledger.LivePIDs()
	for pid := range p.notPython {
		pids = append(pids, uint32(pid))
	}
	for _, pid := range pids {
		if _, err := os.Stat(filepath.Join(p.cfg.ProcRoot, strconv.Itoa(int(pid)))); errors.Is(err, os.ErrNotExist) {
			p.forget(pid, bpfNow()) // seen gone now
		}
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
func (p *Profiler) internFrames(op tracer.Op, frames []symbolize.Frame) []uint32 {
	out := make([]uint32, 0, len(frames)+1)
	out = append(out, p.frameTable.intern(driverFrame(op)))
	for _, f := range frames {
		out = append(out, p.frameTable.intern(f))
	}
	return out
}

// driverFrame is the frame of the driver function a stack ends in.
func driverFrame(op tracer.Op) symbolize.Frame {
	return symbolize.Frame{Function: op.Symbol(), Module: "libcuda.so.1"}
}

// Watch registers a process just started (gpumem record -- COMMAND) as soon
// as its interpreter is up, if it is a Python process, rather than at the
// next scan: a short script may allocate within the first half second.
// Until then, a process that is not (yet) Python is not written off.
func (p *Profiler) Watch(ctx context.Context, pid int) {
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	deadline := time.After(5 * time.Second)
	p.mu.Lock()
	p.watching[pid] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.watching, pid)
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		done := p.py.Has(uint32(pid)) || p.notPython[pid] || p.addPython(pid)
		p.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-ticker.C:
		}
	}
}

// environ is a process's environment, which says which GPUs it sees; none
// when it cannot be read.
func (p *Profiler) environ(pid uint32) []string {
	if len(p.devices) == 0 {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(p.cfg.ProcRoot, strconv.Itoa(int(pid)), "environ"))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}
