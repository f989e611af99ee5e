// Package profiler runs the pipeline from driver calls to books: it attaches
// the tracer to every CUDA driver library it discovers, reads the calls,
// interns and symbolizes their stacks, and keeps the ledger.
package profiler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/budget"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/discover"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/journal"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pystack"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// ErrNoProcess is returned by New for a requested process that does not exist.
var ErrNoProcess = errors.New("no process with pid")

// Config says what to trace.
type Config struct {
	// Tensors says which processes the tensor view covers: every one
	// (TensorsAll, the zero value), those switched on (TensorsOnDemand:
	// TensorPIDs, SetTensors, pods' annotations through TensorAsks), or
	// none.
	Tensors TensorScope
	// TensorPIDs have their tensor view on from the start (TensorsOnDemand).
	TensorPIDs []int
	// TensorBudget bounds an on-demand tensor view's cost.
	TensorBudget budget.Budget
	// DriverBudget bounds a process's driver view's cost: where every
	// tensor reaches the driver (PyTorch without its cache, JAX's platform
	// allocator), a process over it has its driver view switched off.
	DriverBudget budget.Budget
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
	// Pods names the pods and containers of the node (kube.Pods), when
	// an API server is known.
	Pods container.Namer
	// TensorAsks reads the pods' asks for their processes' tensor views
	// (kube.Pods: their annotations), when an API server is known; read at
	// every scan under TensorsOnDemand.
	TensorAsks TensorPolicy
	// ProcRoot is where processes are read from; /proc by default.
	ProcRoot string
	// ScanInterval is how often /proc is scanned for new driver libraries
	// and exited processes (a process's files read only when it is new or
	// changed: discover.Scanner); 500ms by default.
	ScanInterval time.Duration
	// Log receives progress messages (attachments, waiting), the
	// milestones as events (package logs); may be nil.
	Log *slog.Logger
	// OnOOM, when set, receives each out-of-memory snapshot soon after it
	// is taken, in order, from a goroutine of its own (never the one that
	// reads events); Sync and reports wait for those taken before them.
	OnOOM func(snapshot.OOM)
	// NVML is the NVIDIA management library (nvml.Library: where the
	// dynamic loader finds it) read for what nvidia-smi shows per GPU and
	// process, reconciled with the traced memory; none when empty.
	NVML string
	// StateDir, when set, is where the agent's journal lives on the host,
	// and PinPath where its maps and probes are pinned on a BPF file
	// system: the next agent with the same two continues from the books
	// this one leaves (Continued).
	StateDir, PinPath string
	// CompactJournalAt is the journal's size, in bytes, from which it is
	// compacted to what the books still need; 16 MiB by default.
	CompactJournalAt int64
	// Timeline keeps each process's live bytes per GPU and view over time,
	// for Snapshot.Timeline (gpumem record's HTML report): bounded memory
	// (accounting.TimelineBuckets), a few comparisons per event.
	Timeline bool
}

// Profiler is safe for concurrent use: Run in one goroutine, Snapshot,
// EndInterval, DropExited and Sync from others; Close once done. It is one
// goroutine reading the events and these parts, each with its own lock:
//   - the attacher (attach.go) attaches the tracer to the libraries found;
//   - the process table (procs.go) knows each process's name, GPUs, pod and
//     whether it is Python, read from /proc by a job of its own;
//   - the stack store (stackstore.go) interns stacks and names them, by
//     jobs of its own: Python frames at once, native ones in batches;
//   - the books (books.go): the ledger, out-of-memory snapshots and what is
//     counted beside;
//   - NVML's part (gpumemory.go), read by a job of its own and parted with
//     the books by the nvmlparts policy;
//   - the tensor and driver switches (tensors.go, driverview.go): the views
//     switched on and off, measured by the budget policy at every scan;
//   - the flushes (flush.go): the ring buffer's flushes read, which a
//     reader waits for to count every event sent before.
//
// The goroutine that reads events notes each event's process, interns its
// stack and accounts it, and reads one file only, once a process: the name
// of a new process whose first event carries none (a tensor's, another
// thread's; processTable.note). What else takes files or waits is asked of
// the job that does it (job.go), each on a goroutine of its own.
// Every ScanInterval, /proc is scanned for libraries and processes.
// Readers take snapshots (snapshot.go), which change nothing; the loops
// that read once an interval end it (EndInterval) and have the exited
// processes they have read dropped (DropExited), under the naming lock.
// Locks are taken books first, then the stack store or the process table,
// never the other way; no file is read under any of them.
type Profiler struct {
	cfg Config
	tr  Source
	sym *symbolize.Symbolizer // the process table's and the stack store's

	attacher *attacher
	procs    *processTable
	stacks   *stackStore
	books    *books
	gpus     *gpuMemory
	tensors  *tensorSwitch
	driver   *driverSwitch
	flushes  *flushes
	journal  *journal.Journal // with Config.StateDir; Close's
	// replaying counts the events of a previous agent's journal still to
	// read, and compactAt is the journal's size that has it compacted:
	// readEvents'.
	replaying uint64
	compactAt int64
	continued tracer.Continued // what the tracer found of a previous agent's state

	// scanner finds the libraries and Python processes: of the processes
	// that map Config.Library's file only, when it is set. Run's alone.
	scanner    *discover.Scanner
	delivering *job // OOMs delivered, in order (oom.go)
	// naming is held to read by snapshots being named and to write by
	// DropExited: a drop frees frame indices that a snapshot being named
	// holds until it copies the frame table.
	naming  sync.RWMutex
	running atomic.Bool   // Run reads the events
	stop    chan struct{} // closed by Close: the jobs end
	closing sync.Once
}

// New loads the tracer. It fails with tracer.ErrPermission when BPF is
// refused, and when a requested process does not exist.
func New(cfg Config) (*Profiler, error) {
	cfg = cfg.withDefaults()
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
	opts := tracer.Options{PIDs: pids, TensorNativeStacks: cfg.TensorNativeStacks}
	var j *journal.Journal
	if cfg.StateDir != "" {
		var err error
		if j, err = journal.Open(cfg.StateDir); err != nil {
			return nil, err
		}
		opts.State = &tracer.State{PinPath: cfg.PinPath, Journal: j}
	}
	tr, err := load(opts)
	if err != nil {
		if j != nil {
			j.Close()
		}
		return nil, err
	}
	p := newProfiler(cfg, tr)
	p.journal = j
	p.continued = tr.Continued()
	p.sayContinued(p.continued)
	p.replaying = p.continued.Records
	p.books.replaying = p.replaying > 0
	if p.replaying == 0 {
		p.endReplay()
	}
	p.startJobs()
	p.sayMissingCapabilities()
	if cfg.Timeline {
		p.books.ledger.StartTimeline(bpfNow())
	}
	var driverID string
	if cfg.Library != "" {
		if err := p.attacher.attach(discover.Library{Path: cfg.Library}); err != nil {
			p.Close()
			return nil, err
		}
		if driverID, err = discover.FileID(cfg.Library); err != nil {
			p.Close()
			return nil, err
		}
	} else {
		p.attacher.attachInstalled(cfg.ProcRoot, cfg.DriverDirs)
	}
	p.scanner = discover.NewScanner(cfg.ProcRoot, driverID)
	for _, pid := range cfg.TensorPIDs {
		if err := p.SetTensors(pid, snapshot.TensorAsk{By: snapshot.ByFlag}); err != nil {
			p.Close()
			return nil, fmt.Errorf("tensor view of pid %d: %w", pid, err)
		}
	}
	return p, nil
}

// withDefaults is the configuration with its defaults where unset.
func (cfg Config) withDefaults() Config {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.GPUDir == "" {
		cfg.GPUDir = gpuinfo.DriverDir
	}
	if cfg.ScanInterval == 0 {
		cfg.ScanInterval = 500 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.CompactJournalAt == 0 {
		cfg.CompactJournalAt = compactJournalAt
	}
	return cfg
}

// newProfiler assembles the parts around a source of events: the tracer,
// or a test's script. Its jobs start with startJobs.
func newProfiler(cfg Config, tr Source) *Profiler {
	cfg = cfg.withDefaults()
	sym := symbolize.New(cfg.ProcRoot)
	py := pystack.NewResolver()
	stop := make(chan struct{})
	procs := newProcessTable(cfg, sym, tr, py, stop)
	p := &Profiler{
		cfg:      cfg,
		tr:       tr,
		sym:      sym,
		attacher: newAttacher(cfg, tr),
		procs:    procs,
		stacks:   newStackStore(sym, py, procs.reading.await, func(pid uint32) { tr.RemovePython(pid) }, stop),
		books:    newBooks(),
		tensors:  newTensorSwitch(cfg.TensorBudget),
		driver:   newDriverSwitch(cfg.DriverBudget),
		flushes:  newFlushes(),
		scanner:  discover.NewScanner(cfg.ProcRoot, ""),
		stop:     stop,
	}
	p.delivering = newJob(p.deliverOOMs, stop)
	p.gpus = p.newGPUMemory(cfg.NVML)
	return p
}

// startJobs starts the parts' jobs, each on its goroutine, until Close.
func (p *Profiler) startJobs() {
	for _, j := range []*job{p.stacks.resolving, p.stacks.reading, p.procs.reading, p.delivering, p.gpus.sampling} {
		if j != nil {
			go j.loop()
		}
	}
}

// Close detaches every probe, releases the tracer and ends the
// profiler's jobs, whether Run ran or not. Snapshots taken after read the
// books as they were left, naming no more stacks.
func (p *Profiler) Close() error {
	var err error
	p.closing.Do(func() {
		p.closeTensors()
		p.attacher.close()
		err = p.tr.Close()
		close(p.stop)
		p.gpus.close()
		if p.journal != nil {
			p.journal.Close()
		}
	})
	return err
}

// Run traces until ctx is done, then reads the events still buffered and
// detaches the probes; the books stay to be read until Close. New stacks
// are asked to be named at every scan too, so that their raw frames are
// kept no longer than that.
func (p *Profiler) Run(ctx context.Context) error {
	p.running.Store(true)
	defer p.running.Store(false)
	defer p.tr.Close()
	defer p.attacher.close()
	defer p.closeTensors()
	defer p.scanner.Close()
	// The first scan registers the Python processes running already before
	// an event is read: the stacks a continued state replays, and those
	// sent while no agent ran, are named with their Python frames.
	p.scan(true)
	readErr := make(chan error, 1)
	go func() { readErr <- p.readEvents() }()

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
			p.stacks.askResolving()
			p.gpus.askRead()
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

// drain reads every event sent before the stop, and keeps the final loss
// counts for the snapshots.
func (p *Profiler) drain(readErr chan error) error {
	if err := p.Sync(); err != nil {
		return err
	}
	p.stacks.reading.await() // exited Python processes forgotten
	losses, err := p.tr.Losses()
	p.books.close(losses)
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
	p.procs.reading.await()
	p.delivering.await()
	return nil
}

// flush returns once every event sent before the call has been read.
func (p *Profiler) flush() error { return p.flushes.wait(p.tr) }

func (p *Profiler) readEvents() error {
	var ev tracer.Event
	for {
		err := p.tr.Read(&ev)
		switch {
		case errors.Is(err, ringbuf.ErrFlushed):
			p.flushes.read()
			continue
		case err != nil:
			return err
		}
		if p.handle(&ev) {
			p.delivering.ask() // off the event path
			p.gpus.ask()
		}
		if err := p.keepState(); err != nil {
			return err
		}
	}
}

// keepState ends the replay of a previous agent's events once they are
// read, and compacts the journal once it grew past compactAt.
func (p *Profiler) keepState() error {
	if p.replaying > 0 {
		if p.replaying--; p.replaying == 0 {
			p.endReplay()
		}
	}
	if size := p.tr.JournalBytes(); size > max(p.compactAt, p.cfg.CompactJournalAt) {
		if err := p.tr.Compact(p.books.compaction()); err != nil {
			return fmt.Errorf("compact the journal: %w", err)
		}
		p.compactAt = 2 * p.tr.JournalBytes() // so that a journal of live records only is not compacted at every event
	}
	return nil
}

// handle accounts one event; true when it took an out-of-memory snapshot.
func (p *Profiler) handle(ev *tracer.Event) (oom bool) {
	var python bool
	var id accounting.StackID
	comm := processComm(ev)
	switch {
	case ev.Carried != nil:
		if err := p.books.carry(ev.Carried); err != nil {
			logs.Printf(p.cfg.Log, "%v", err)
		}
		return false
	case ev.Exit:
		p.pythonExited(ev.PID)
		p.gpus.exited(ev.PID)
	case ev.Op.MakesContext(), ev.Op.LoadsModule():
		python = p.procs.note(ev.PID, comm, notedContext)
		id = p.stacks.intern(ev)
		p.gpus.madeEvent(ev, id)
	case ev.Op == memory.OpCtxDestroy, ev.Op.UnloadsModule():
		p.procs.note(ev.PID, comm, notedRelease)
		p.gpus.madeEvent(ev, 0)
	case ev.Op.IsFree() || ev.Op.IsRetain():
		p.procs.note(ev.PID, comm, notedRelease)
	default:
		python = p.procs.note(ev.PID, comm, notedAllocation)
		id = p.stacks.intern(ev)
	}
	if p.replaying > 0 && !ev.Exit {
		p.procs.seenSince(ev.PID, wallTime(ev.Timestamp))
	}
	return p.books.account(ev, id, python)
}

// processComm is the process's name an event says: its comm if its
// process's first thread made it, else "" (the name known stays); another
// thread's comm is its own (PyTorch's autograd threads: pt_autograd_0).
func processComm(ev *tracer.Event) string {
	if ev.TID != ev.PID {
		return ""
	}
	return ev.Comm
}

// pythonExited has an exited process no longer walked, if it was a Python
// process, once its stacks' Python frames are read.
func (p *Profiler) pythonExited(pid uint32) {
	if p.procs.exited(pid) {
		p.stacks.pythonExited(pid)
	}
}

// SymbolStats are what the symbol tables hold: the agent reports their
// share of its memory.
func (p *Profiler) SymbolStats() symbolize.Stats { return p.sym.Stats() }

// scan registers Python processes, attaches to driver libraries that
// appeared, and releases the memory of traced processes that are gone
// without their exit being seen.
func (p *Profiler) scan(first bool) {
	p.releaseVanished()
	for _, pid := range p.books.livePIDs() {
		p.scanner.Calling(int(pid)) // its allocator found now, not at its next look
	}
	found, err := p.scanner.Scan(p.cfg.PIDs)
	if err != nil {
		logs.Printf(p.cfg.Log, "scan processes: %v", err)
		return
	}
	if p.procs.askPython(found.Python) {
		p.procs.reading.await() // walked from their first allocation through a library attached now
	}
	drivers := p.attacher.attachFound(found.Libraries)
	p.updateTensors(time.Now())
	p.updateDriverViews(time.Now())
	if first && drivers == 0 && p.cfg.Library == "" {
		logs.Event(p.cfg.Log, logs.Waiting, fmt.Sprintf("waiting for a process to load libcuda.so (scanning every %v)", p.cfg.ScanInterval),
			"scan_interval", p.cfg.ScanInterval.String())
	}
}

// releaseVanished releases what processes gone without their exit being
// seen held, as if they exited now.
func (p *Profiler) releaseVanished() {
	pids := append(p.books.livePIDs(), p.procs.notPythonPIDs()...)
	for _, pid := range pids {
		if gone(p.cfg.ProcRoot, int(pid)) {
			p.books.exit(pid, bpfNow()) // seen gone now
			p.pythonExited(pid)
		}
	}
}

// sayContinued says what the tracer found of a previous agent's state.
func (p *Profiler) sayContinued(c tracer.Continued) {
	if p.cfg.StateDir == "" {
		return
	}
	if r := c.Refused; r != nil {
		logs.Event(p.cfg.Log, logs.State, fmt.Sprintf("the state at %s was not continued: %s; starting afresh", p.cfg.StateDir, r.Detail),
			"continued", false, "reason", r.Reason, "detail", r.Detail)
		return
	}
	logs.Event(p.cfg.Log, logs.State, fmt.Sprintf("continued the state at %s: %d records replayed, %d bytes written while no agent ran", p.cfg.StateDir, c.Records, c.Waiting),
		"continued", true, "records", c.Records, "waiting", c.Waiting)
}
