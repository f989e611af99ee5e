package profiler

import (
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Snapshot is the books at one moment, named: what every reader of the
// profiler reads (the agent's exporter and gauges once an interval,
// Report for gpumem record, top and the IG operator; Totals, for a scrape
// of the metrics, is a copy of its own), and
// nothing in it calls back into the profiler. Taking one changes nothing;
// the profiler never changes a snapshot once taken; SnapshotTo and
// EndInterval reuse the memory of one their caller is done with. Stack IDs
// are stable: a stack keeps its ID from its first event until its process
// is dropped, so a reader may key a cache on them.
type Snapshot struct {
	Time     time.Time
	Failures []Failure // in no order
	OOMs     []OOM     // out-of-memory snapshots, oldest first, the latest MaxOOMs
	// Peaks are each process's per GPU and view, by PID, GPU and view:
	// EndInterval's are the interval's, with Shares and no Rows; a
	// snapshot's are over the run (exited processes' until dropped), with
	// Rows.
	Peaks    []Peak
	Timeline *Timeline // with Config.Timeline: live bytes over time
	Counts
	Libraries []string // driver libraries attached

	rows   []snapshotRow
	procs  map[uint32]*process // of the rows, peaks and failures
	shares []accounting.PeakRow
	// The rows' frames: the frame table's, by index, as the rows were
	// named; those of stacks not named yet (a Whole snapshot names them
	// first: rare).
	table   []*symbolize.Frame
	unnamed map[accounting.StackID][]*symbolize.Frame
	// What DropExited needs: the exits the books had seen (their clock),
	// and the processes with rows left out, their stacks being named.
	exits   uint64
	waiting map[uint32]bool
}

// snapshotRow is a row of the books as a snapshot keeps it: its process's
// name, pod and GPUs are the snapshot's, once per process; its frames,
// indices in the snapshot's table.
type snapshotRow struct {
	accounting.Key
	accounting.Counters
	frames []uint32 // the stack's, shared with the profiler: read-only
}

// IntervalParts say what EndInterval reads of the interval.
type IntervalParts int

const (
	// RowsAndPeaks are the interval's peaks and the rows whose stacks are
	// named, never waiting for symbols but for the peaks' rows. A row whose
	// stack is still being named (in the background, a library's table read
	// at its first use) is left out, and is in a later interval with every
	// byte counted since, so that an exporter of the differences between
	// intervals loses nothing and counts nothing twice.
	RowsAndPeaks IntervalParts = iota
	// PeaksOnly are the interval's peaks without rows: for a reader of the
	// peaks alone (the agent's gauges, with no Pyroscope server), which then
	// copies no row.
	PeaksOnly
)

// Len is how many rows the snapshot holds.
func (s *Snapshot) Len() int { return len(s.rows) }

// EachRow calls fn with each row, in no order. The row and its frame
// slice are reused: fn must not keep them; the frames themselves are
// read-only and never change.
func (s *Snapshot) EachRow(fn func(*Row)) {
	var row Row
	var frames []*symbolize.Frame
	for i := range s.rows {
		r := &s.rows[i]
		frames = s.appendFrames(frames[:0], r)
		row = s.procs[r.PID].row(r.Key, r.Counters, frames)
		fn(&row)
	}
}

// appendFrames appends a row's frames to dst.
func (s *Snapshot) appendFrames(dst []*symbolize.Frame, r *snapshotRow) []*symbolize.Frame {
	if r.frames == nil {
		return append(dst, s.unnamed[r.Stack]...)
	}
	for _, f := range r.frames {
		dst = append(dst, s.table[f])
	}
	return dst
}

// Rows are the snapshot's rows, by live bytes, then allocated bytes,
// descending, appended to dst.
func (s *Snapshot) Rows(dst []Row) []Row {
	dst = slices.Grow(dst, len(s.rows))
	s.EachRow(func(r *Row) {
		row := *r
		row.Frames = slices.Clone(r.Frames)
		dst = append(dst, row)
	})
	sortRows(dst)
	return dst
}

// row is a row of process p.
func (p *process) row(k accounting.Key, c accounting.Counters, frames []*symbolize.Frame) Row {
	return Row{Key: k, Comm: p.comm, Device: p.device(k), Container: p.container, Frames: frames, Counters: c}
}

// device is the GPU a row's memory is on, if known.
func (p *process) device(k accounting.Key) gpuinfo.Device {
	if !k.Kind.OnDevice() {
		return gpuinfo.Device{}
	}
	return p.ordinals[int(k.Device)]
}

// Snapshot takes the books at this moment: every row, its stack named
// first if need be (the first stack through a large library waits for its
// symbol table), and the run's peaks with their rows. Read errors of the
// loss counters are returned beside a complete snapshot of everything
// else.
func (p *Profiler) Snapshot() (*Snapshot, error) {
	s := &Snapshot{}
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
func (p *Profiler) SnapshotTo(s *Snapshot) error {
	p.procs.reading.await()
	p.stacks.resolving.await()
	p.delivering.await()
	p.reset(s)
	peaks, timeline, err := p.copyBooks(s, true, true)
	p.nameRows(s, true)
	p.finish(s, peaks, timeline, true)
	return err
}

// EndInterval ends the interval the books are in and begins the next: s
// gets what the interval held (parts of it), its peaks then start again
// from the level at this moment. The agent calls it once an interval.
func (p *Profiler) EndInterval(s *Snapshot, parts IntervalParts) error {
	p.procs.reading.await()
	p.reset(s)
	peaks, _, err := p.copyBooks(s, false, parts == RowsAndPeaks)
	if !p.stacks.allNamed(s.shares) {
		p.stacks.resolving.await() // a row of a peak is in the snapshot
	}
	p.nameRows(s, false)
	p.finish(s, peaks, nil, false)
	return err
}

// reset empties s, keeping the memory of its rows.
func (p *Profiler) reset(s *Snapshot) {
	*s = Snapshot{rows: s.rows[:0], shares: s.shares[:0], table: s.table[:0],
		Libraries: p.attacher.appendLibraries(s.Libraries[:0]), procs: map[uint32]*process{}}
}

// finish names what s holds besides its rows: its peaks, timeline,
// failures and processes.
func (p *Profiler) finish(s *Snapshot, peaks []accounting.Peak, timeline *accounting.Timeline, withRows bool) {
	s.Python.Processes = p.procs.registeredPython()
	s.TensorViews = p.tensors.list()
	for _, pk := range peaks {
		s.procs[pk.PID] = nil // the timeline's processes are the run's peaks'
	}
	p.procs.lookup(s.procs)
	s.Peaks = p.peaks(s, peaks, withRows)
	s.Timeline = p.timeline(timeline, s.procs)
	for i := range s.Failures {
		f := &s.Failures[i]
		f.Comm, f.Frames = s.procs[f.PID].comm, p.stacks.stackFrames(f.Stack)
	}
}

// copyBooks copies the books into s, with rows or not, and returns the
// peaks and timeline to name: the run's peaks and its timeline for a
// snapshot of the run (whole), else the interval's peaks as it ends.
func (p *Profiler) copyBooks(s *Snapshot, whole, rows bool) ([]accounting.Peak, *accounting.Timeline, error) {
	losses, err := p.currentLosses()
	b := p.books
	b.mu.Lock()
	defer b.mu.Unlock()
	s.Time, s.Losses, s.exits = time.Now(), losses, b.exits
	s.Ledger, s.Python, s.NativeTruncated, s.Events = b.ledger.Stats(), b.python, b.nativeTruncated, b.events
	s.OOMs = slices.Clone(b.ooms)
	if rows {
		p.copyRows(s)
	}
	b.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if p.onGPU(k.Key) {
			s.Failures = append(s.Failures, Failure{FailureKey: k, Failures: f})
			s.procs[k.PID] = nil
		}
	})
	if whole {
		var timeline *accounting.Timeline
		if p.cfg.Timeline {
			tl := b.ledger.Timeline(bpfNow())
			timeline = &tl
		}
		return b.ledger.Peaks(), timeline, err
	}
	peaks := b.ledger.TakeIntervalPeaks(bpfNow())
	for i := range peaks { // into s: the ledger reuses its buffer
		start := len(s.shares)
		s.shares = append(s.shares, peaks[i].Rows...)
		peaks[i].Rows = s.shares[start:len(s.shares):len(s.shares)]
	}
	return peaks, nil, err
}

// copyRows copies the books' rows into s. The caller holds p.books.mu.
func (p *Profiler) copyRows(s *Snapshot) {
	l := p.books.ledger
	s.rows = slices.Grow(s.rows, l.Len())
	l.Rows(func(k accounting.Key, c accounting.Counters) {
		if p.onGPU(k) {
			s.rows = append(s.rows, snapshotRow{Key: k, Counters: c})
			s.procs[k.PID] = nil
		}
	})
}

// nameRows names the snapshot's rows. Unless whole, the rows whose
// stacks are being named are left out, and their processes are kept from
// being dropped until a snapshot has them (s.waiting).
func (p *Profiler) nameRows(s *Snapshot, whole bool) {
	s.table, s.unnamed = p.stacks.nameRows(s.rows, s.table, whole)
	if whole {
		return
	}
	s.rows = slices.DeleteFunc(s.rows, func(r snapshotRow) bool {
		if r.frames != nil { // named
			return false
		}
		if s.waiting == nil {
			s.waiting = map[uint32]bool{}
		}
		s.waiting[r.PID] = true
		return true
	})
	clear(s.rows[len(s.rows):cap(s.rows)]) // frames of the previous snapshot: not kept alive
	if len(s.waiting) > 0 {
		p.stacks.resolving.ask()
	}
}

// currentLosses are the tracer's loss counts, or its last ones once closed.
// The BPF maps are read without the books' lock: events keep flowing.
func (p *Profiler) currentLosses() (schema.Losses, error) {
	b := p.books
	b.mu.Lock()
	closed, losses := b.closed, b.losses
	b.mu.Unlock()
	if closed {
		return losses, nil
	}
	return p.tr.Losses()
}
