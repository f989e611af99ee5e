package profiler

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/snapshot"
)

// Snapshot takes the books at this moment: every row, its stack named
// first if need be (the first stack through a large library waits for its
// symbol table), and the run's peaks with their rows. Taking one changes
// nothing. Read errors of the loss counters are returned beside a complete
// snapshot of everything else.
func (p *Profiler) Snapshot() (*snapshot.Snapshot, error) {
	s := &snapshot.Snapshot{}
	err := p.SnapshotTo(s)
	return s, err
}

// SnapshotTo is Snapshot into s, reusing the memory of its rows: a caller
// that takes one every interval, done with the previous one by the time it
// takes the next, keeps one. The processes noted so far are read first
// (their pods and GPUs), the stacks named and the out-of-memory snapshots
// delivered, each by its job; Sync before it counts every event sent
// before. The events flow meanwhile, but for the moment the books' rows
// are copied.
func (p *Profiler) SnapshotTo(s *snapshot.Snapshot) error {
	p.procs.reading.await()
	p.stacks.resolving.await()
	p.delivering.await()
	p.gpus.await()
	p.naming.RLock()
	defer p.naming.RUnlock()
	procs := p.reset(s)
	err := p.stamp(s)
	peaks, timeline := p.books.readRun(s, procs, p.onGPU, p.cfg.Timeline)
	peaks = p.gpus.addToPeaks(peaks, p.onGPU, bpfNow())
	p.gpus.addStackRows(s, procs, p.onGPU)
	s.Frames = p.stacks.nameRowsSoFar(s.Entries, s.Frames)
	p.nameProcesses(s, procs, peaks)
	s.Peaks = p.namedPeaks(procs, peaks)
	s.Timeline = p.timeline(timeline, procs)
	s.GPUMemory = p.gpus.latestView()
	p.gpus.addRows(s, procs, p.onGPU)
	return err
}

// EndInterval ends the interval the books are in and begins the next: s
// gets what the interval held, its peaks then start again from the level
// at this moment. The agent calls it once an interval. The interval's
// peaks have their Shares, not their Rows: an exporter of the interval
// names them by its rows. Its rows are those whose stacks are named, never
// waiting for symbols but for the peaks' rows: a row whose stack is still
// being named (in the background, a library's table read at its first
// use) is left out, and is in a later interval with every byte counted
// since, so that an exporter of the differences between intervals loses
// nothing and counts nothing twice.
func (p *Profiler) EndInterval(s *snapshot.Snapshot) error {
	p.procs.reading.await()
	p.gpus.await()
	p.naming.RLock()
	defer p.naming.RUnlock()
	procs := p.reset(s)
	err := p.stamp(s)
	peaks := p.books.endInterval(s, procs, p.onGPU)
	peaks = p.gpus.addToPeaks(peaks, p.onGPU, bpfNow())
	p.gpus.addStackRows(s, procs, p.onGPU)
	if !p.stacks.allNamed(peaks) {
		p.stacks.resolving.await() // a row of a peak is in the snapshot
	}
	p.keepNamedRows(s)
	p.nameProcesses(s, procs, peaks)
	s.Peaks = p.sharedPeaks(procs, peaks)
	s.GPUMemory = p.gpus.latestView()
	p.gpus.addRows(s, procs, p.onGPU)
	return err
}

// reset empties s, keeping the memory of its rows, and returns the map of
// the processes it will hold.
func (p *Profiler) reset(s *snapshot.Snapshot) map[uint32]*process {
	s.Reset()
	s.Libraries = p.attacher.appendLibraries(s.Libraries)
	return map[uint32]*process{}
}

// stamp sets s's time and loss counts, read before the books are copied.
func (p *Profiler) stamp(s *snapshot.Snapshot) error {
	losses, err := p.currentLosses()
	s.Time, s.Losses = time.Now(), losses
	return err
}

// nameProcesses names what s holds besides its rows' frames and peaks:
// its rows' processes, its failures, and the views' states; the peaks'
// processes are looked up with the rows'.
func (p *Profiler) nameProcesses(s *snapshot.Snapshot, procs map[uint32]*process, peaks []accounting.Peak) {
	s.Python.Processes = p.procs.registeredPython()
	s.TensorViews = p.tensors.list()
	s.DriverViewsOff = p.DriverViewsOff()
	for _, pk := range peaks {
		procs[pk.PID] = nil // the timeline's processes are the run's peaks'
	}
	p.procs.lookup(procs)
	for i := range s.Entries {
		s.Entries[i].Process = &procs[s.Entries[i].PID].Process
	}
	for i := range s.Failures {
		f := &s.Failures[i]
		f.Comm, f.Frames = procs[f.PID].Comm, p.stacks.stackFrames(f.Stack)
	}
	slices.SortStableFunc(s.Failures, func(a, b snapshot.Failure) int { return cmp.Compare(b.Count, a.Count) })
}

// keepNamedRows names the interval's rows whose stacks are named and
// leaves the others out, their processes kept from being dropped until a
// snapshot has them (s.Waiting).
func (p *Profiler) keepNamedRows(s *snapshot.Snapshot) {
	s.Frames, _ = p.stacks.nameRows(s.Entries, s.Frames)
	waiting := map[uint32]bool{}
	s.Entries = slices.DeleteFunc(s.Entries, func(e snapshot.Entry) bool {
		if e.Frames != nil { // named
			return false
		}
		waiting[e.PID] = true
		return true
	})
	clear(s.Entries[len(s.Entries):cap(s.Entries)]) // frames of the previous snapshot: not kept alive
	for pid := range waiting {
		s.Waiting = append(s.Waiting, pid)
	}
	if len(waiting) > 0 {
		p.stacks.resolving.ask()
	}
}

// currentLosses are the tracer's loss counts, or its last ones once closed.
// The BPF maps are read without the books' lock: events keep flowing.
func (p *Profiler) currentLosses() (schema.Losses, error) {
	if losses, closed := p.books.lastLosses(); closed {
		return losses, nil
	}
	return p.tr.Losses()
}
