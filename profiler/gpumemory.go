package profiler

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/logs"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/nvmlparts"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// The frames of the rows NVML's numbers make (nvmlparts.StackDriverInternal,
// nvmlparts.StackUntraced), shared by every snapshot: read-only.
var (
	frameDriverInternal = &symbolize.Frame{Function: "[CUDA context, kernel images and driver internals]"}
	frameUntraced       = &symbolize.Frame{Function: "[process gpu-mem does not trace]"}
)

// gpuMemory is what NVML says the GPUs hold, read by a job of its own
// (sampling): at every scan, when a context is made or destroyed, after an
// out-of-memory failure, and before every snapshot and totals, which wait
// for it. Each read is joined with the books at that moment and parted
// (nvmlparts): what a traced process uses beyond its traced memory is its
// contexts and modules gpu-mem saw made and the rest; that, and what an
// untraced process uses, become rows of their own (KindContext,
// KindModule, KindDriverInternal, KindUntraced), so that every output
// shows them. This is the glue: when to read, the books' numbers fed in,
// the rows handed to the snapshots.
type gpuMemory struct {
	path     string
	sampling *job // nil without a library to read

	libMu  sync.Mutex
	loaded bool        // once tried
	lib    *nvml.NVML  // nil without NVML, and once closed
	sample nvml.Sample // the job's alone, read under libMu

	lastErr string // the last read's error, said once: the job's alone

	mu    sync.Mutex
	parts *nvmlparts.Parts // nil without NVML to read: nothing to keep
}

// newGPUMemory is the part that reads NVML from path (none when empty).
// Its job, p's to start, loads the library at its first run, not here: a
// command's own errors come first.
func (p *Profiler) newGPUMemory(path string) *gpuMemory {
	g := &gpuMemory{path: path}
	if path != "" {
		g.sampling = newJob(p.sampleGPUs, p.stop)
		g.parts = nvmlparts.New()
	}
	return g
}

// loadNVML loads NVML once; without it (no driver, no library) the parts
// beyond the traced memory are unknown, which it says once. libMu is held.
func (p *Profiler) loadNVML(g *gpuMemory) {
	g.loaded = true
	lib, err := nvml.Open(g.path)
	if err != nil {
		g.mu.Lock()
		g.parts = nil
		g.mu.Unlock()
		logs.Printf(p.cfg.Log, "NVML: %v: the memory nvidia-smi shows beyond what is traced (contexts, kernel images, driver internals) is unknown", err)
		return
	}
	logs.Event(p.cfg.Log, logs.NVML, fmt.Sprintf("NVML: driver %s (%s)", lib.DriverVersion, g.path), "driver", lib.DriverVersion, "library", g.path)
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
	if g.sampling != nil {
		g.sampling.ask()
	}
}

// await waits for a read of NVML begun after the call, when there is NVML.
func (g *gpuMemory) await() {
	if g.sampling != nil {
		g.sampling.await()
	}
}

// sampleGPUs reads NVML and has it parted with the books: the job's run.
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
			logs.Printf(p.cfg.Log, "NVML: read: %v", err)
		}
		return
	}
	r := nvmlparts.Join(&g.sample, at, p.nvmlProcesses(&g.sample), before, p.liveOnDevices())
	g.lastErr = ""
	g.mu.Lock()
	g.parts.Update(r)
	g.mu.Unlock()
}

// nvmlProcesses are the processes a sample lists: those traced as the
// process table knows them, the others named from /proc.
func (p *Profiler) nvmlProcesses(s *nvml.Sample) map[uint32]nvmlparts.Process {
	known := map[uint32]*process{}
	for _, gpu := range s.GPUs {
		for _, pr := range gpu.Processes {
			known[pr.PID] = nil
		}
	}
	p.procs.known(known)
	procs := make(map[uint32]nvmlparts.Process, len(known))
	for pid, proc := range known {
		if proc == nil {
			procs[pid] = nvmlparts.Process{Comm: readComm(p.cfg.ProcRoot, pid)}
		} else {
			procs[pid] = nvmlparts.Process{Comm: proc.Comm, Traced: true, GPUs: proc.GPUs}
		}
	}
	return procs
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
func (p *Profiler) liveOnDevices() map[nvmlparts.ProcessDevice]uint64 {
	if p.running.Load() { // else nothing reads the events, and none come
		_ = p.flush() // an error: the tracer is closed, nothing comes any more
	}
	return p.books.liveOnDevices()
}

// askRead has NVML read, unless it could not be loaded: nothing to read
// then, and no job to wake at every scan.
func (g *gpuMemory) askRead() {
	g.libMu.Lock()
	failed := g.loaded && g.lib == nil
	g.libMu.Unlock()
	if !failed {
		g.ask()
	}
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

// madeEvent notes a context made or a module loaded (with the stack id
// that made it), or one destroyed or unloaded, and has NVML read: the read
// sizes it. Without NVML, nothing.
func (g *gpuMemory) madeEvent(ev *tracer.Event, id accounting.StackID) {
	g.mu.Lock()
	parts := g.parts
	if parts != nil {
		parts.Made(ev.Op, ev.PID, ev.Device, id, ev.Address, ev.Began)
	}
	g.mu.Unlock()
	if parts != nil {
		g.sampling.ask()
	}
}

// exited forgets the contexts and modules of a process that exited.
func (g *gpuMemory) exited(pid uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.parts != nil {
		g.parts.Exited(pid)
	}
}

// locked runs f with the parts, under the lock; not without NVML.
func (g *gpuMemory) locked(f func(*nvmlparts.Parts)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.parts != nil {
		f(g.parts)
	}
}

// latestView is the last read's view of the GPUs: nil without NVML, or
// before its first read.
func (g *gpuMemory) latestView() (view *snapshot.GPUMemory) {
	g.locked(func(parts *nvmlparts.Parts) { view = parts.View() })
	return view
}

// addStackRows adds the sized contexts' and modules' rows that keep says
// to s, before its rows are named (their stacks are the stack store's),
// and notes their processes in procs.
func (g *gpuMemory) addStackRows(s *snapshot.Snapshot, procs map[uint32]*process, keep func(accounting.Key) bool) {
	g.locked(func(parts *nvmlparts.Parts) {
		for k, c := range parts.Rows() {
			if k.Kind.FromNVMLWithStack() && keep(k) {
				s.Entries = append(s.Entries, snapshot.Entry{Key: k, Counters: c})
				procs[k.PID] = nil
			}
		}
	})
}

// addToPeaks adds NVML's part, as last read, to each process's driver-view
// peak on a GPU (nvmlparts.AddToPeaks), of the rows keep says.
func (g *gpuMemory) addToPeaks(peaks []accounting.Peak, keep func(accounting.Key) bool, ts uint64) []accounting.Peak {
	g.locked(func(parts *nvmlparts.Parts) {
		peaks = nvmlparts.AddToPeaks(peaks, parts.Rows(), keep, ts)
	})
	return peaks
}

// addRows adds NVML's rows that keep says but those with stacks
// (addStackRows), with their frames, their processes from procs where it
// has them, else named by the view of the GPUs.
func (g *gpuMemory) addRows(s *snapshot.Snapshot, procs map[uint32]*process, keep func(accounting.Key) bool) {
	g.locked(func(parts *nvmlparts.Parts) {
		if len(parts.Rows()) == 0 {
			return
		}
		first := uint32(len(s.Frames))
		s.Frames = append(s.Frames, frameDriverInternal, frameUntraced)
		for k, c := range parts.Rows() {
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
				e.Process = &snapshot.Process{Comm: parts.View().Comm(k.PID)}
			}
			s.Entries = append(s.Entries, e)
		}
	})
}

// addSeries sets t's view of the GPUs and adds NVML's rows that keep
// says as series (a process's contexts, or modules, on one GPU summed in
// one), those of untraced processes named by the view.
func (g *gpuMemory) addSeries(t *snapshot.Totals, keep func(accounting.Key) bool) {
	g.locked(func(parts *nvmlparts.Parts) {
		t.GPUMemory = parts.View()
		series := newSeriesSums(t)
		for k, c := range parts.Rows() {
			if keep(k) {
				s := series.add(k, c)
				if k.Kind == memory.KindUntraced {
					s.Comm = parts.View().Comm(k.PID)
				}
			}
		}
	})
}
