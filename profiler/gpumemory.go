package profiler

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/nvml"
	"github.com/gpu-mem/gpu-mem/snapshot"
	"github.com/gpu-mem/gpu-mem/symbolize"
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
// (sampling): at every scan, after an out-of-memory failure, and before
// every snapshot and totals, which wait for it. Each read is reconciled
// with the books at that moment: what a traced process uses beyond its
// traced memory, and what an untraced one uses, become rows of their own
// (KindDriverInternal, KindUntraced), so that every output shows them.
type gpuMemory struct {
	sampling *job // nil without NVML

	libMu  sync.Mutex
	lib    *nvml.NVML // nil without NVML, and once closed
	sample nvml.Sample

	mu   sync.Mutex
	view *snapshot.GPUMemory // the latest, never changed: shared by snapshots
	// rows are NVML's rows: their live bytes are the latest read's, what
	// they grew by counted as allocations, what they shrank by as frees;
	// one at zero is dropped at the next read that does not list it.
	rows map[accounting.Key]accounting.Counters
}

// openGPUMemory loads NVML from path; without it (no path, no driver) the
// parts beyond the traced memory are unknown, which it says once. Its job
// is p's to start.
func (p *Profiler) openGPUMemory(path string) *gpuMemory {
	g := &gpuMemory{rows: map[accounting.Key]accounting.Counters{}}
	if path == "" {
		return g
	}
	lib, err := nvml.Open(path)
	if err != nil {
		p.cfg.Logf("NVML: %v: the memory nvidia-smi shows beyond what is traced (contexts, kernel images, driver internals) is unknown", err)
		return g
	}
	p.cfg.Logf("NVML: driver %s (%s)", lib.DriverVersion, path)
	g.lib, g.sampling = lib, newJob(p.sampleGPUs, p.stop)
	return g
}

// close unloads NVML, once no read is under way.
func (g *gpuMemory) close() {
	g.libMu.Lock()
	defer g.libMu.Unlock()
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

// sampleGPUs reads NVML and reconciles it with the books: the job's run.
// The books are summed first: a free between the two then leaves NVML's
// number the smaller, never counting bytes twice.
func (p *Profiler) sampleGPUs() {
	g := p.gpus
	live := p.books.liveOnDevices()
	g.libMu.Lock()
	if g.lib == nil {
		g.libMu.Unlock()
		return
	}
	err := g.lib.Read(&g.sample)
	var view *snapshot.GPUMemory
	var rows map[accounting.Key]uint64
	if err == nil {
		view, rows = p.reconcile(&g.sample, live)
	}
	g.libMu.Unlock()
	if err != nil {
		p.cfg.Logf("NVML: read: %v", err)
		return
	}
	g.update(view, rows)
}

// reconcile joins an NVML sample with the traced memory live (per process
// and CUDA ordinal): the view, and the live bytes of NVML's rows.
func (p *Profiler) reconcile(s *nvml.Sample, live map[processDevice]uint64) (*snapshot.GPUMemory, map[accounting.Key]uint64) {
	procs := map[uint32]*process{}
	onGPUs := map[uint32]int{} // how many GPUs each process is on
	for _, gpu := range s.GPUs {
		for _, pr := range gpu.Processes {
			procs[pr.PID] = nil
			onGPUs[pr.PID]++
		}
	}
	p.procs.known(procs)
	view := &snapshot.GPUMemory{Time: s.Time, GPUs: make([]snapshot.GPU, 0, len(s.GPUs))}
	rows := map[accounting.Key]uint64{}
	for _, gpu := range s.GPUs {
		v := snapshot.GPU{Index: gpu.Index, UUID: gpu.UUID, Total: gpu.Total, Reserved: gpu.Reserved, Used: gpu.Used}
		var ofProcesses uint64
		for _, pr := range gpu.Processes {
			ofProcesses += pr.Used
			pm := snapshot.ProcessMemory{PID: pr.PID, NVML: pr.Used}
			proc, device := procs[pr.PID], int32(gpu.Index)
			if proc != nil {
				device = proc.ordinal(gpu)
				pm.Traced, pm.Comm = true, proc.Comm
				pm.Driver = live[processDevice{pr.PID, device}]
				if onGPUs[pr.PID] == 1 { // made in a context gpu-mem did not see created: on this GPU
					pm.Driver += live[processDevice{pr.PID, memory.DeviceUnknown}]
				}
				pm.DriverInternal = int64(pr.Used) - int64(pm.Driver)
				rows[accounting.Key{PID: pr.PID, Stack: stackDriverInternal, Kind: memory.KindDriverInternal, Device: device}] = uint64(max(pm.DriverInternal, 0))
			} else {
				pm.Comm = readComm(p.cfg.ProcRoot, pr.PID)
				rows[accounting.Key{PID: pr.PID, Stack: stackUntraced, Kind: memory.KindUntraced, Device: device}] = pr.Used
			}
			pm.GPU = memory.GPU(memory.KindDevice, device)
			v.Processes = append(v.Processes, pm)
		}
		v.NotOfProcesses = gpu.Used - min(ofProcesses, gpu.Used)
		slices.SortFunc(v.Processes, func(a, b snapshot.ProcessMemory) int { return cmp.Compare(a.PID, b.PID) })
		view.GPUs = append(view.GPUs, v)
	}
	return view, rows
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

// update installs a reconciled read: its view, and its rows' live bytes.
func (g *gpuMemory) update(view *snapshot.GPUMemory, live map[accounting.Key]uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.view = view
	for k, c := range g.rows {
		if _, listed := live[k]; !listed && c.LiveBytes() == 0 {
			delete(g.rows, k)
		} else if !listed {
			live[k] = 0
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
		if !keep(k) {
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
// says as series, those of untraced processes named by the view.
func (g *gpuMemory) addSeries(t *snapshot.Totals, keep func(accounting.Key) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t.GPUMemory = g.view
	for k, c := range g.rows {
		if keep(k) {
			s := snapshot.Series{SeriesKey: snapshot.SeriesOf(k), Counters: c}
			if k.Kind == memory.KindUntraced {
				s.Comm = g.view.Comm(k.PID)
			}
			t.Series = append(t.Series, s)
		}
	}
}
