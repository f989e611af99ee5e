package profiler

import (
	"cmp"
	"slices"
	"sort"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/schema"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Report is the books at one moment, with stacks resolved.
type Report struct {
	Time     time.Time
	Rows     []Row     // by live bytes, then allocated bytes, descending
	Failures []Failure // by count, descending
	OOMs     []OOM     // out-of-memory snapshots, oldest first, the latest MaxOOMs
	Peaks    []Peak    // each process's per GPU and view over the run (exited ones until dropped), by PID, GPU, view
	Timeline *Timeline // live bytes over time per process, GPU and view; nil without Config.Timeline
	Counts
	Libraries []string // driver libraries attached
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
	// TensorViews are the processes' tensor views switched on on demand
	// (Config.Tensors TensorsOnDemand): from when each holds.
	TensorViews []TensorView
}

// Row is what one stack of one process did with one kind of memory.
type Row struct {
	accounting.Key
	Comm      string
	Device    gpuinfo.Device     // the GPU, where the driver says which it is
	Container container.Identity // the pod and container, from the process's cgroup
	Frames    []*symbolize.Frame // innermost first, shared with other rows: read-only
	accounting.Counters
}

// Failure counts failed allocations with one origin and error code.
type Failure struct {
	accounting.FailureKey
	Comm   string
	Frames []*symbolize.Frame
	accounting.Failures
}

// Report is a Whole snapshot of the books, its rows sorted. Read errors of
// the loss counters are reported as an error beside a complete report of
// everything else.
func (p *Profiler) Report() (Report, error) {
	s, err := p.Snapshot()
	return s.Report(), err
}

// Report is the snapshot as a report: its rows sorted, its failures by
// count. The frames are shared with the snapshot.
func (s *Snapshot) Report() Report {
	failures := slices.Clone(s.Failures)
	sort.Slice(failures, func(i, j int) bool { return failures[i].Count > failures[j].Count })
	return Report{Time: s.Time, Rows: s.Rows(nil), Failures: failures, OOMs: s.OOMs, Peaks: s.Peaks,
		Timeline: s.Timeline, Counts: s.Counts, Libraries: s.Libraries}
}

// EachRow calls fn with each row of the report, as Snapshot.EachRow does.
func (r *Report) EachRow(fn func(*Row)) {
	for i := range r.Rows {
		fn(&r.Rows[i])
	}
}

// sortRows sorts rows by live bytes, then allocated bytes, descending.
func sortRows(rows []Row) {
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.LiveBytes(), a.LiveBytes()), cmp.Compare(b.AllocBytes, a.AllocBytes), cmp.Compare(a.PID, b.PID))
	})
}

// onGPU says whether a row is on the devices the report is limited to.
func (p *Profiler) onGPU(k accounting.Key) bool {
	if len(p.cfg.GPUs) == 0 {
		return true
	}
	return k.Kind.OnDevice() && slices.Contains(p.cfg.GPUs, int(k.Device))
}
