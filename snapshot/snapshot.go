// Package snapshot is gpu-mem's output model: the books at one moment,
// named (Snapshot: rows, peaks, failures, out-of-memory events, the
// timeline), and summed (Totals). Every output reads it (pprof, report,
// metrics, the Pyroscope exporter, IG's data sources); it is plain data,
// and nothing it imports links BPF.
package snapshot

import (
	"cmp"
	"slices"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Snapshot is the books at one moment, named. Its rows are kept compactly
// (Entries: their frames indices in Frames, their process shared), as the
// profiler hands them over a hundred thousand at a time; EachRow and Rows
// read them as Rows. Nothing in it calls back into the profiler. Stack
// IDs are stable: a stack keeps its ID from its first event until its
// process is dropped, so a reader may key a cache on them.
type Snapshot struct {
	Time     time.Time
	Failures []Failure // by count, descending
	OOMs     []OOM     // out-of-memory snapshots, oldest first, the latest MaxOOMs
	// Peaks are each process's per GPU and view, by PID, GPU and view: an
	// interval's with Shares and no Rows; the run's (exited processes'
	// until dropped) with Rows.
	Peaks    []Peak
	Timeline *Timeline // live bytes over time per process, GPU and view, when kept
	Counts
	Libraries []string // driver libraries attached
	// GPUMemory is what NVML says the GPUs hold, reconciled with the rows;
	// nil without NVML. Its parts are rows too (memory.KindDriverInternal,
	// memory.KindUntraced).
	GPUMemory *GPUMemory

	Entries []Entry
	Frames  []*symbolize.Frame // the entries' frames: shared, read-only
	// Breakdown is where each process's memory went on each GPU, by
	// category: set by its reader (breakdown.Fill), nil until.
	Breakdown []Breakdown
	// Growing are the rows that grew interval after interval, by rate,
	// descending, and Exhaustion when each GPU they are on runs out at
	// their rates: set by their reader (growth.Detector), nil until.
	Growing    []Growing
	Exhaustion []Exhaustion
	// Layout is where the segments and tensors of the processes with
	// the tensor view lie, with the rows: what the breakdown measures
	// PyTorch's fragmentation by.
	Layout []accounting.Allocation

	// Exits is how many process exits the books had seen when it was
	// taken: the processes that exited by then are dropped once it is read
	// (Profiler.DropExited).
	Exits uint64
	// Waiting are the processes with rows an interval left out, their
	// stacks being named: a later interval has them, with every byte since.
	Waiting []uint32
	// shares holds the interval peaks' Shares (KeepShares), its memory
	// reused by the next snapshot taken into the same Snapshot.
	shares []accounting.PeakRow
}

// Reset empties s for the next snapshot taken into it, keeping the memory
// of its rows, frames, layout, libraries and peaks' shares.
func (s *Snapshot) Reset() {
	*s = Snapshot{Entries: s.Entries[:0], Frames: s.Frames[:0], Layout: s.Layout[:0], Libraries: s.Libraries[:0], shares: s.shares[:0]}
}

// KeepShares copies a peak's shares, held in memory their maker reuses
// (accounting.Ledger.TakeIntervalPeaks), into s's own, and returns the
// copy: valid until the next snapshot is taken into s.
func (s *Snapshot) KeepShares(rows []accounting.PeakRow) []accounting.PeakRow {
	start := len(s.shares)
	s.shares = append(s.shares, rows...)
	return s.shares[start:len(s.shares):len(s.shares)]
}

// Counts are what the books count beside their rows.
type Counts struct {
	Losses schema.Losses
	Ledger accounting.Stats
	Python PythonStats
	// NativeTruncated counts allocations whose native stack was deeper than
	// the 127 frames kept: their outermost frames are missing.
	NativeTruncated uint64
	Events          uint64 // events read
	// TensorViews are the processes' tensor views switched on on demand:
	// from when each holds.
	TensorViews []TensorView
	// DriverViewsOff are the processes whose driver view the budget
	// switched off: their driver rows are partial from then on.
	DriverViewsOff []DriverViewOff
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

// Entry is a row as a snapshot keeps it.
type Entry struct {
	accounting.Key
	accounting.Counters
	Before accounting.Amount // allocated before this agent began (accounting.Ledger.Before)
	// Low is the least live bytes the row held since its interval began
	// (accounting.Ledger.IntervalLow): an interval's (Profiler.EndInterval)
	// or, in a snapshot, the current interval's so far.
	Low     uint64
	Frames  []uint32 // indices in Snapshot.Frames, innermost first: read-only
	Process *Process // shared with other entries: read-only
}

// Process is what a snapshot knows of one process.
type Process struct {
	Comm string
	// Since is when the agent first saw the process (its first event: a
	// CUDA context made, before its first allocation): where its counters
	// start from zero.
	Since     time.Time
	GPUs      map[int]gpuinfo.Device // its CUDA ordinals' GPUs
	Container container.Identity     // its pod and container, from its cgroup
}

// Row is what one stack of one process did with one kind of memory.
type Row struct {
	accounting.Key
	Comm      string
	Device    gpuinfo.Device     // the GPU, where the driver says which it is
	Container container.Identity // the pod and container, from the process's cgroup
	Frames    []*symbolize.Frame // innermost first, shared with other rows: read-only
	accounting.Counters
	Before accounting.Amount // allocated before this agent began: a previous agent's, pushed
}

// Failure counts failed allocations with one origin and error code.
type Failure struct {
	accounting.FailureKey
	Comm   string
	Frames []*symbolize.Frame
	accounting.Failures
}

// Row is a row of process p.
func (p *Process) Row(k accounting.Key, c accounting.Counters, frames []*symbolize.Frame) Row {
	if p == nil {
		p = &Process{}
	}
	return Row{Key: k, Comm: p.Comm, Device: p.Device(k), Container: p.Container, Frames: frames, Counters: c}
}

// Device is the GPU a row's memory is on, if known.
func (p *Process) Device(k accounting.Key) gpuinfo.Device {
	if p == nil || !k.Kind.OnDevice() {
		return gpuinfo.Device{}
	}
	return p.GPUs[int(k.Device)]
}

// New is a snapshot of rows taken at t: for a reader that has its rows
// whole (the IG data source's reader, tests).
func New(t time.Time, rows ...Row) *Snapshot {
	s := &Snapshot{Time: t}
	s.Add(rows...)
	return s
}

// Add adds rows and their frames.
func (s *Snapshot) Add(rows ...Row) {
	var last *Process
	for _, r := range rows {
		e := Entry{Key: r.Key, Counters: r.Counters, Frames: make([]uint32, len(r.Frames))}
		for i, f := range r.Frames {
			e.Frames[i] = uint32(len(s.Frames))
			s.Frames = append(s.Frames, f)
		}
		if last == nil || last.Comm != r.Comm || last.Container != r.Container {
			last = &Process{Comm: r.Comm, Container: r.Container, GPUs: map[int]gpuinfo.Device{}}
		}
		if r.Kind.OnDevice() && r.Device != (gpuinfo.Device{}) {
			last.GPUs[int(r.Key.Device)] = r.Device
		}
		e.Process = last
		s.Entries = append(s.Entries, e)
	}
}

// Len is how many rows the snapshot holds.
func (s *Snapshot) Len() int { return len(s.Entries) }

// EachRow calls fn with each row, in no order. The row and its frame
// slice are reused: fn must not keep them; the frames themselves are
// read-only and never change.
func (s *Snapshot) EachRow(fn func(*Row)) {
	var row Row
	var frames []*symbolize.Frame
	for i := range s.Entries {
		row = s.row(&s.Entries[i], frames[:0])
		frames = row.Frames
		fn(&row)
	}
}

// RowOf is entry e of s as a Row, its frames its own.
func (s *Snapshot) RowOf(e *Entry) Row { return s.row(e, make([]*symbolize.Frame, 0, len(e.Frames))) }

// row is entry e as a Row, its frames appended to frames.
func (s *Snapshot) row(e *Entry, frames []*symbolize.Frame) Row {
	for _, f := range e.Frames {
		frames = append(frames, s.Frames[f])
	}
	row := e.Process.Row(e.Key, e.Counters, frames)
	row.Before = e.Before
	return row
}

// Rows are the snapshot's rows, by live bytes, then allocated bytes,
// descending.
func (s *Snapshot) Rows() []Row {
	rows := make([]Row, 0, len(s.Entries))
	s.EachRow(func(r *Row) {
		row := *r
		row.Frames = slices.Clone(r.Frames)
		rows = append(rows, row)
	})
	SortRows(rows)
	return rows
}

// SortRows sorts rows by live bytes, then allocated bytes, descending.
func SortRows(rows []Row) {
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.LiveBytes(), a.LiveBytes()), cmp.Compare(b.AllocBytes, a.AllocBytes), cmp.Compare(a.PID, b.PID))
	})
}

// SortByLive sorts what a process held at one moment by live bytes,
// descending; on a tie, tensors before the segments they are in.
func SortByLive(rows []Row) {
	slices.SortStableFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.LiveBytes(), a.LiveBytes()), cmp.Compare(b.Kind, a.Kind))
	})
}

// With is s with rows added: a snapshot built in one expression.
func (s Snapshot) With(rows ...Row) *Snapshot {
	s.Add(rows...)
	return &s
}
