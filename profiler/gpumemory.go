package profiler

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Stacks of the rows NVML's numbers make, out of the range the stack store
// hands out (from 1 up): the one frame each shows says what it is.
const (
	stackDriverInternal accounting.StackID = ^accounting.StackID(0) - iota
	stackUntraced
)

// The frames of those rows, shared by every snapshot: read-only.
var (
	frameDriverInternal = &symbolize.Frame{Function: "[CUDA context, kernel images and driver internals]"}
	frameUntraced       = &symbolize.Frame{Function: "[process gpu-mem does not trace]"}
)

// gpuMemory is what NVML says the GPUs hold, read by a job of its own
// (sampling): at every scan, when a context is made or destroyed, after an
// out-of-memory failure, and before every snapshot and totals, which wait
// for it. Each read is reconciled with the books at that moment: what a
// traced process uses beyond its traced memory is its contexts and
// modules gpu-mem saw made (each NVML's growth across its making, charged
// to the stack that made it) and the rest; that, and what an untraced
// process uses, become rows of their own (KindContext, KindModule,
// KindDriverInternal, KindUntraced), so that every output shows them.
type gpuMemory struct {
	path     string
	sampling *job        // nil without a library to read
	none     atomic.Bool // the library could not be loaded: nothing to keep

	libMu  sync.Mutex
	loaded bool        // once tried
	lib    *nvml.NVML  // nil without NVML, and once closed
	sample nvml.Sample // the job's alone, read under libMu

	lastErr string // the last read's error, said once: the job's alone

	mu   sync.Mutex
	view *snapshot.GPUMemory // the latest, never changed: shared by snapshots
	// rows are NVML's rows: their live bytes are the latest read's, what
	// they grew by counted as allocations, what they shrank by as frees.
	rows map[accounting.Key]accounting.Counters
	// charged are the contexts and modules seen made, sized by the first
	// read after; past are the last reads, newest last.
	charged []*madeCharge
	past    []pastRead
}

// pastReads bounds the reads kept: a charge is sized against the last
// read that ended before its call began, and reads are asked for at every
// context and module made (a framework loads hundreds of modules at its
// start, a context with eager loading takes a second or more).
const pastReads = 64

// pastRead is what one read found, for sizing what was made after it.
type pastRead struct {
	at uint64 // when it ended, on the clock of BPF timestamps
	// residual is each traced process's NVML number less its traced
	// memory on each GPU: what a context or module grew it by;
	// untraced is each untraced process's NVML number.
	residual, untraced map[processDevice]int64
}

// madeCharge is a context seen made or a module seen loaded, until
// destroyed, unloaded or its process gone.
type madeCharge struct {
	row     accounting.Key // its process, the stack that made it, KindContext or KindModule, its device
	address uint64         // the context's or module's handle
	at      uint64         // when its call began (BPF clock)
	bytes   uint64
	sized   bool
}

// newGPUMemory is the part that reads NVML from path (none when empty).
// Its job, p's to start, loads the library at its first run, not here: a
// command's own errors come first.
func (p *Profiler) newGPUMemory(path string) *gpuMemory {
	g := &gpuMemory{path: path, rows: map[accounting.Key]accounting.Counters{}}
	if path != "" {
		g.sampling = newJob(p.sampleGPUs, p.stop)
	}
	return g
}

// loadNVML loads NVML once; without it (no driver, no library) the parts
// beyond the traced memory are unknown, which it says once. libMu is held.
func (p *Profiler) loadNVML(g *gpuMemory) {
	g.loaded = true
	lib, err := nvml.Open(g.path)
	if err != nil {
		g.none.Store(true)
		p.cfg.Logf("NVML: %v: the memory nvidia-smi shows beyond what is traced (contexts, kernel images, driver internals) is unknown", err)
		return
	}
	p.cfg.Logf("NVML: driver %s (%s)", lib.DriverVersion, g.path)
	g.lib = lib
}

// close unloads NVML, once no read is under way.
func (g *gpuMemory) close() {
	g.libMu.Lock()
	defer g.libMu.Unlock()
	g.loaded = true // not loaded after
	if g.lib != nil {
		g.lib.Close()
		g.lib = nil
	}
}

// ask has NVML read soon, when there is NVML.
func (g *gpuMemory) ask() {
	if g.sampling != nil && !g.none.Load() {
		g.sampling.ask()
	}
}

// await waits for a read of NVML begun after the call, when there is NVML.
func (g *gpuMemory) await() {
	if g.sampling != nil && !g.none.Load() {
		g.sampling.await()
	}
}

// sampleGPUs reads NVML and reconciles it with the books: the job's run.
// The books are summed on both sides of the read, every event sent before
// accounted: what a context made just before grew NVML's number by is its
// own, the allocations made after it in the books already, and a process
// whose traced memory moved during the read is known to be unsettled in it.
func (p *Profiler) sampleGPUs() {
	g := p.gpus
	if !p.nvmlLoaded() {
		return
	}
	before := p.liveOnDevices()
	at, err := g.read()
	if errors.Is(err, errClosed) {
		return
	}
	if err != nil {
		if msg := err.Error(); msg != g.lastErr { // said once, not at every scan
			g.lastErr = msg
			p.cfg.Logf("NVML: read: %v", err)
		}
		return
	}
	r := p.reconcile(&g.sample, before, p.liveOnDevices())
	r.at = at
	g.lastErr = ""
	g.update(r)
}

// errClosed says NVML was closed before a read.
var errClosed = errors.New("NVML closed")

// read reads NVML into the sample, and says when the read ended, on the
// clock of BPF timestamps. The lock is not held beyond it: waiting for the
// events (liveOnDevices) under it would hold up a close.
func (g *gpuMemory) read() (uint64, error) {
	g.libMu.Lock()
	defer g.libMu.Unlock()
	if g.lib == nil {
		return 0, errClosed
	}
	if err := g.lib.Read(&g.sample); err != nil {
		return 0, err
	}
	return bpfNow(), nil
}

// liveOnDevices is the traced memory live per process and CUDA ordinal,
// every event sent before accounted.
func (p *Profiler) liveOnDevices() map[processDevice]uint64 {
	if p.running.Load() { // else nothing reads the events, and none come
		_ = p.flush() // an error: the tracer is closed, nothing comes any more
	}
	return p.books.liveOnDevices()
}

// nvmlLoaded loads NVML at the first run of the job, and says whether
// there is one to read.
func (p *Profiler) nvmlLoaded() bool {
	g := p.gpus
	g.libMu.Lock()
	defer g.libMu.Unlock()
	if !g.loaded {
		p.loadNVML(g)
	}
	return g.lib != nil
}

// reconciled is an NVML read joined with the books: the view (its
// processes' contexts not yet parted out), each traced process's NVML
// number less its traced memory per CUDA ordinal, and the rows of the
// untraced processes.
type reconciled struct {
	at   uint64 // when the read ended, on the clock of BPF timestamps
	view *snapshot.GPUMemory
	// residual is each traced process's NVML number less the more of its
	// traced memory before and after the read: never what an allocation
	// made during the read grew NVML by. settled are those whose traced
	// memory did not move during the read, whose residual is exact.
	residual map[processDevice]int64
	settled  map[processDevice]bool
	traced   map[processDevice]*snapshot.ProcessMemory // in view
	untraced map[accounting.Key]uint64
	// onlyOn is the ordinal of each traced process NVML lists on one GPU
	// only: where what it made on an unknown device is.
	onlyOn map[uint32]int32
}

// reconcile joins an NVML sample with the traced memory live (per process
// and CUDA ordinal) before and after it.
func (p *Profiler) reconcile(s *nvml.Sample, before, after map[processDevice]uint64) reconciled {
	procs := map[uint32]*process{}
	onGPUs := map[uint32]int{} // how many GPUs each process is on
	for _, gpu := range s.GPUs {
		for _, pr := range gpu.Processes {
			procs[pr.PID] = nil
			onGPUs[pr.PID]++
		}
	}
	p.procs.known(procs)
	r := reconciled{view: &snapshot.GPUMemory{Time: s.Time, GPUs: make([]snapshot.GPU, 0, len(s.GPUs))},
		residual: map[processDevice]int64{}, settled: map[processDevice]bool{}, traced: map[processDevice]*snapshot.ProcessMemory{}, untraced: map[accounting.Key]uint64{},
		onlyOn: map[uint32]int32{}}
	for _, gpu := range s.GPUs {
		devices := map[uint32]int32{} // the traced processes' ordinals of the GPU
		v := snapshot.GPU{Index: gpu.Index, UUID: gpu.UUID, Total: gpu.Total, Reserved: gpu.Reserved, Used: gpu.Used}
		var ofProcesses uint64
		for _, pr := range gpu.Processes {
			ofProcesses += pr.Used
			pm := snapshot.ProcessMemory{PID: pr.PID, NVML: pr.Used}
			proc, device := procs[pr.PID], int32(gpu.Index)
			if proc != nil {
				device = proc.ordinal(gpu)
				pm.Traced, pm.Comm = true, proc.Comm
				onOneGPU := onGPUs[pr.PID] == 1
				if onOneGPU {
					r.onlyOn[pr.PID] = device
				}
				was, now := tracedOn(before, pr.PID, device, onOneGPU), tracedOn(after, pr.PID, device, onOneGPU)
				pm.Driver = max(was, now)
				pm.DriverInternal = int64(pr.Used) - int64(pm.Driver)
				r.residual[processDevice{pr.PID, device}] = pm.DriverInternal
				r.settled[processDevice{pr.PID, device}] = was == now
				devices[pr.PID] = device
			} else {
				pm.Comm = readComm(p.cfg.ProcRoot, pr.PID)
				r.untraced[accounting.Key{PID: pr.PID, Stack: stackUntraced, Kind: memory.KindUntraced, Device: device}] = pr.Used
			}
			pm.GPU = memory.GPU(memory.KindDevice, device)
			v.Processes = append(v.Processes, pm)
		}
		v.NotOfProcesses = gpu.Used - min(ofProcesses, gpu.Used)
		slices.SortFunc(v.Processes, func(a, b snapshot.ProcessMemory) int { return cmp.Compare(a.PID, b.PID) })
		r.view.GPUs = append(r.view.GPUs, v) // its capacity made: the processes stay where they are
		for i := range v.Processes {
			if pm := &v.Processes[i]; pm.Traced {
				r.traced[processDevice{pm.PID, devices[pm.PID]}] = pm
			}
		}
	}
	return r
}

// tracedOn is process pid's traced memory on device in live; with what it
// made on an unknown device where NVML lists it on one GPU only (made in a
// context gpu-mem did not see created: on this GPU).
func tracedOn(live map[processDevice]uint64, pid uint32, device int32, onOneGPU bool) uint64 {
	n := live[processDevice{pid, device}]
	if onOneGPU {
		n += live[processDevice{pid, memory.DeviceUnknown}]
	}
	return n
}

// ordinal is the CUDA ordinal by which the process names gpu: found by
// its UUID among the GPUs its environment shows it; NVML's index where
// gpu-mem cannot tell which GPUs the process sees (no NVIDIA driver's
// description in /proc, as on the simulated driver).
func (p *process) ordinal(gpu nvml.GPU) int32 {
	for ordinal, d := range p.GPUs {
		if d.UUID == gpu.UUID {
			return int32(ordinal)
		}
	}
	return int32(gpu.Index)
}

// readComm is a process's name, from /proc; empty once it is gone.
func readComm(procRoot string, pid uint32) string {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

// update installs a reconciled read: the contexts and modules made since
// the last one sized, each process's part beyond them, the view, the rows.
func (g *gpuMemory) update(r reconciled) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sizeCharged(r.residual, r.onlyOn)
	g.fitCharged(r.residual, r.settled)
	live := r.untraced
	inContexts, inModules := map[processDevice]uint64{}, map[processDevice]uint64{}
	for _, c := range g.charged {
		if c.sized {
			live[c.row] += c.bytes
			in := inContexts
			if c.row.Kind == memory.KindModule {
				in = inModules
			}
			in[processDevice{c.row.PID, c.row.Device}] += c.bytes
		}
	}
	for pd, rest := range r.residual {
		rest -= int64(inContexts[pd] + inModules[pd])
		live[accounting.Key{PID: pd.pid, Stack: stackDriverInternal, Kind: memory.KindDriverInternal, Device: pd.device}] = uint64(max(rest, 0))
	}
	for pd, pm := range r.traced {
		pm.Contexts, pm.Modules = inContexts[pd], inModules[pd]
		pm.DriverInternal -= int64(pm.Contexts + pm.Modules)
	}
	read := pastRead{at: r.at, residual: r.residual, untraced: map[processDevice]int64{}}
	for k, used := range live {
		if k.Kind == memory.KindUntraced {
			read.untraced[processDevice{k.PID, k.Device}] = int64(used)
		}
	}
	g.past = append(g.past[max(len(g.past)-pastReads+1, 0):], read)
	g.view = r.view
	g.setRows(live)
}

// sizeCharged gives the contexts and modules made since the last read
// their bytes: what their process's NVML number less its traced memory
// grew by on their GPU since before they were made (before), shared
// alike by those made on it meanwhile. A module loaded in a context
// gpu-mem did not see made (its device unknown) is on the one GPU NVML
// lists its process on, if one. Sized ones of a process NVML no longer
// lists on their GPU are dropped: gone with it.
func (g *gpuMemory) sizeCharged(residual map[processDevice]int64, onlyOn map[uint32]int32) {
	made := map[processDevice][]*madeCharge{}
	g.charged = slices.DeleteFunc(g.charged, func(c *madeCharge) bool {
		if device, ok := onlyOn[c.row.PID]; ok && c.row.Device == memory.DeviceUnknown {
			c.row.Device = device
		}
		pd := processDevice{c.row.PID, c.row.Device}
		_, listed := residual[pd]
		if !c.sized && listed {
			made[pd] = append(made[pd], c)
		}
		return c.sized && !listed
	})
	for pd, cs := range made {
		grew := uint64(max(residual[pd]-g.before(pd, cs), 0))
		for i, c := range cs {
			c.bytes, c.sized = grew/uint64(len(cs)), true
			if i == 0 {
				c.bytes += grew % uint64(len(cs))
			}
		}
	}
}

// fitCharged has the contexts and modules of each process and GPU whose
// read is settled give back what their process's NVML number less its
// traced memory no longer holds: sized by a growth that held more than
// they made (a lazily loaded module's, with other memory made and freed
// since), they are cut to what NVML shows, modules before contexts, the
// newest first. So traced memory, contexts, modules and the rest add up
// to NVML's number at every settled read.
func (g *gpuMemory) fitCharged(residual map[processDevice]int64, settled map[processDevice]bool) {
	over := map[processDevice]uint64{}
	for _, c := range g.charged {
		if pd := (processDevice{c.row.PID, c.row.Device}); c.sized && settled[pd] {
			over[pd] += c.bytes
		}
	}
	for pd, charged := range over {
		over[pd] = uint64(max(int64(charged)-residual[pd], 0))
	}
	byCut := slices.Clone(g.charged)
	slices.SortStableFunc(byCut, func(a, b *madeCharge) int {
		return cmp.Or(-cmp.Compare(a.row.Kind, b.row.Kind), -cmp.Compare(a.at, b.at))
	})
	for _, c := range byCut {
		pd := processDevice{c.row.PID, c.row.Device}
		if cut := min(over[pd], c.bytes); c.sized && cut > 0 {
			c.bytes -= cut
			over[pd] -= cut
		}
	}
}

// setRows sets the live bytes of NVML's rows; a row not listed is gone,
// as a dropped process's rows are (a context's stack goes with its
// process).
func (g *gpuMemory) setRows(live map[accounting.Key]uint64) {
	for k := range g.rows {
		if _, listed := live[k]; !listed {
			delete(g.rows, k)
		}
	}
	for k, now := range live {
		c := g.rows[k]
		switch was := c.LiveBytes(); {
		case now > was:
			c.AllocBytes += now - was
			c.AllocCount++
		case now < was:
			c.FreeBytes += was - now
			c.FreeCount++
		}
		g.rows[k] = c
	}
}

// madeEvent notes a context made or a module loaded (with the stack id
// that made it), or one destroyed or unloaded, and has NVML read: the read
// sizes it. Without NVML, nothing.
func (g *gpuMemory) madeEvent(ev *tracer.Event, id accounting.StackID) {
	if g.sampling == nil || g.none.Load() {
		return
	}
	g.mu.Lock()
	kind := madeKind(ev.Op)
	if ev.Op.MakesContext() || ev.Op.LoadsModule() {
		g.charged = append(g.charged, &madeCharge{
			row:     accounting.Key{PID: ev.PID, Stack: id, Kind: kind, Device: ev.Device},
			address: ev.Address,
			at:      ev.Began,
		})
	} else {
		g.charged = slices.DeleteFunc(g.charged, func(c *madeCharge) bool {
			return c.row.PID == ev.PID && c.row.Kind == kind && c.address == ev.Address
		})
	}
	g.mu.Unlock()
	g.sampling.ask()
}

// before is what process and GPU pd's NVML number less its traced memory
// was before cs were made: at the last read that ended before the first
// of them began (a read during a call saw part of its growth; one may
// come after a call and before its event), plus what was made after that
// read and sized already (its growth is counted once). From nothing where NVML did not list the process then or
// no read did, and, where gpu-mem did not trace the process then (it
// attached to it while it ran), from its NVML number for modules alone
// (not theirs), from nothing for a context (NVML may have listed the
// process while making it).
func (g *gpuMemory) before(pd processDevice, cs []*madeCharge) int64 {
	first := slices.MinFunc(cs, func(a, b *madeCharge) int { return cmp.Compare(a.at, b.at) }).at
	i := len(g.past) - 1
	for i >= 0 && g.past[i].at > first {
		i--
	}
	if i < 0 {
		return 0
	}
	was, traced := g.past[i].residual[pd]
	if !traced && !slices.ContainsFunc(cs, func(c *madeCharge) bool { return c.row.Kind == memory.KindContext }) {
		was = g.past[i].untraced[pd]
	}
	for _, c := range g.charged {
		if c.sized && c.at > g.past[i].at && (processDevice{c.row.PID, c.row.Device}) == pd {
			was += int64(c.bytes)
		}
	}
	return was
}

// madeKind is the kind of memory op makes or ends: a module's, else a
// context's.
func madeKind(op memory.Op) memory.Kind {
	if op.LoadsModule() || op.UnloadsModule() {
		return memory.KindModule
	}
	return memory.KindContext
}

// exited forgets the contexts and modules of a process that exited.
func (g *gpuMemory) exited(pid uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.charged = slices.DeleteFunc(g.charged, func(c *madeCharge) bool { return c.row.PID == pid })
}

// addStackRows adds the sized contexts' and modules' rows that keep says
// to s, before its rows are named (their stacks are the stack store's),
// and notes their processes in procs.
func (g *gpuMemory) addStackRows(s *snapshot.Snapshot, procs map[uint32]*process, keep func(accounting.Key) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, c := range g.rows {
		if k.Kind.FromNVMLWithStack() && keep(k) {
			s.Entries = append(s.Entries, snapshot.Entry{Key: k, Counters: c})
			procs[k.PID] = nil
		}
	}
}

// addToPeaks adds to each process's driver-view peak on a GPU what NVML
// says it holds there beyond its allocations, as last read (its contexts,
// modules and driver internals: held throughout, whatever its allocations
// did), so that a peak is never below what the process holds, nor below
// nvidia-smi's number for it. A process that holds only those gets a peak
// of them, at ts. The peaks' rows are copied before any is added: they
// may share memory (Snapshot.Shares).
func (g *gpuMemory) addToPeaks(peaks []accounting.Peak, keep func(accounting.Key) bool, ts uint64) []accounting.Peak {
	g.mu.Lock()
	defer g.mu.Unlock()
	at := make(map[accounting.PeakKey]int, len(peaks))
	for i, pk := range peaks {
		at[pk.PeakKey] = i
	}
	for k, c := range g.rows {
		if k.Kind == memory.KindUntraced || c.LiveBytes() == 0 || !keep(k) {
			continue
		}
		pk := accounting.PeakKey{PID: k.PID, View: memory.ViewDriver, GPU: k.GPU()}
		i, ok := at[pk]
		if !ok {
			i = len(peaks)
			at[pk] = i
			peaks = append(peaks, accounting.Peak{PeakKey: pk, Time: ts})
		}
		held := accounting.Amount{Bytes: c.LiveBytes(), Count: c.LiveCount()}
		peaks[i].Bytes += held.Bytes
		peaks[i].Count += held.Count
		peaks[i].Rows = append(slices.Clip(peaks[i].Rows), accounting.PeakRow{Key: k, Amount: held})
	}
	return peaks
}

// addTo sets s's view of the GPUs (nil without NVML) and, with rows,
// adds NVML's rows that keep says, with their frames, their processes
// from procs where it has them, else named by the view.
func (g *gpuMemory) addTo(s *snapshot.Snapshot, procs map[uint32]*process, keep func(accounting.Key) bool, rows bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s.GPUMemory = g.view
	if !rows || len(g.rows) == 0 {
		return
	}
	first := uint32(len(s.Frames))
	s.Frames = append(s.Frames, frameDriverInternal, frameUntraced)
	for k, c := range g.rows {
		if !keep(k) || k.Kind.FromNVMLWithStack() {
			continue
		}
		e := snapshot.Entry{Key: k, Counters: c, Frames: []uint32{first}}
		if k.Kind == memory.KindUntraced {
			e.Frames[0] = first + 1
		}
		if p := procs[k.PID]; p != nil && k.Kind != memory.KindUntraced {
			e.Process = &p.Process
		} else {
			e.Process = &snapshot.Process{Comm: g.view.Comm(k.PID)}
		}
		s.Entries = append(s.Entries, e)
	}
}

// addSeries sets t's view of the GPUs and adds NVML's rows that keep
// says as series (a process's contexts, or modules, on one GPU summed in
// one), those of untraced processes named by the view.
func (g *gpuMemory) addSeries(t *snapshot.Totals, keep func(accounting.Key) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t.GPUMemory = g.view
	series := newSeriesSums(t)
	for k, c := range g.rows {
		if keep(k) {
			s := series.add(k, c)
			if k.Kind == memory.KindUntraced {
				s.Comm = g.view.Comm(k.PID)
			}
		}
	}
}
