package profiler

import (
	"cmp"
	"slices"
	"sort"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/pystack"
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
	Losses   schema.Losses
	Ledger   accounting.Stats
	Python   PythonStats
	// NativeTruncated counts allocations whose native stack was deeper than
	// the 127 frames kept: their outermost frames are missing.
	NativeTruncated uint64
	Events          uint64   // events read
	Libraries       []string // driver libraries attached
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

// Report copies the books. Read errors of the loss counters are reported as
// an error beside a complete report of everything else.
func (p *Profiler) Report() (Report, error) {
	var r Report
	err := p.ReportTo(&r)
	return r, err
}

// ReportTo is Report into r, reusing the memory of r's rows and failures:
// a caller that reports every interval, done with the previous report by
// the time it asks for the next, keeps one Report rather than building
// every row anew. The frames themselves are shared with the profiler.
func (p *Profiler) ReportTo(r *Report) error {
	p.enrichNoted()
	p.resolve()
	p.deliverOOMs()
	err := p.fillReport(r)
	// Sorted without the lock: events keep flowing meanwhile.
	slices.SortFunc(r.Rows, func(a, b Row) int {
		if c := cmp.Compare(b.LiveBytes(), a.LiveBytes()); c != 0 {
			return c
		}
		if c := cmp.Compare(b.AllocBytes, a.AllocBytes); c != 0 {
			return c
		}
		return cmp.Compare(a.PID, b.PID)
	})
	sort.Slice(r.Failures, func(i, j int) bool { return r.Failures[i].Count > r.Failures[j].Count })
	return err
}

// fillReport reads the books into r, unsorted.
func (p *Profiler) fillReport(r *Report) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.startInterval(false)
	losses, err := p.currentLosses()
	*r = Report{Time: time.Now(), Losses: losses, Ledger: p.ledger.Stats(), Python: p.pyStats, Events: p.events,
		NativeTruncated: p.nativeTruncated,
		OOMs:            slices.Clone(p.ooms), Rows: r.Rows[:0], Failures: r.Failures[:0], Libraries: r.Libraries[:0]}
	for _, lib := range p.attached {
		r.Libraries = append(r.Libraries, lib.Path)
	}
	sort.Strings(r.Libraries)
	named := map[uint32]container.Identity{}
	// The previous report's rows, with their frame slices, are written over;
	// grown at once: 100,000 rows are 25 MB.
	rows := r.Rows[:cap(r.Rows)]
	if n := p.ledger.Len(); n > len(rows) {
		rows = slices.Grow(rows, n-len(rows))
	}
	n := 0
	p.ledger.Rows(func(k accounting.Key, c accounting.Counters) {
		if !p.onGPU(k) {
			return
		}
		var frames []*symbolize.Frame
		if n < len(rows) {
			frames = rows[n].Frames[:0]
		}
		row := p.row(k, c, frames, named)
		if n < len(rows) {
			rows[n] = row
		} else {
			rows = append(rows, row)
		}
		n++
	})
	r.Rows = rows[:n]
	clear(rows[n:cap(rows)]) // what the previous report held beyond: not kept alive
	r.Peaks = p.peaks(p.ledger.Peaks(), named, true)
	r.Timeline = p.timeline()
	p.ledger.EachFailure(func(k accounting.FailureKey, f accounting.Failures) {
		if p.onGPU(k.Key) {
			r.Failures = append(r.Failures, Failure{FailureKey: k, Comm: p.comms[k.PID], Frames: p.frames(k.Stack), Failures: f})
		}
	})
	clear(r.Failures[len(r.Failures):cap(r.Failures)])
	return err
}

// EachRow calls fn with each row of the books, one at a time and in no
// order, and returns the time they were listed: for a consumer that keeps
// what it needs of each (an exporter), without a report of every row. The
// rows are read under the profiler's lock a chunk at a time, and fn runs
// without it, so that events keep flowing while fn works; a row dropped
// meanwhile is skipped. The row and its frame slice are reused: fn must
// not keep them.
//
// EachRow never waits for symbols: a row whose stack is still being named
// (in the background, a library's table read at its first use) is left
// out of this listing, and listed by a later one with every byte counted
// since, so that an exporter of the differences between listings loses
// nothing and counts nothing twice.
func (p *Profiler) EachRow(fn func(*Row)) time.Time {
	p.enrichNoted() // every row of a process read has its pod and GPUs
	p.mu.Lock()
	p.startInterval(false)
	keys := make([]accounting.Key, 0, p.ledger.Len())
	p.unlisted = nil // the processes this listing leaves rows of out
	p.ledger.Rows(func(k accounting.Key, _ accounting.Counters) {
		switch {
		case !p.onGPU(k):
		case !p.stacks.m[k.Stack].named():
			if p.unlisted == nil {
				p.unlisted = map[uint32]bool{}
			}
			p.unlisted[k.PID] = true
		default:
			keys = append(keys, k)
		}
	})
	listed := time.Now()
	waiting := len(p.unlisted) > 0
	p.mu.Unlock()
	if waiting {
		p.askResolve()
	}
	const chunk = 1024
	rows := make([]Row, chunk)
	named := map[uint32]container.Identity{}
	for len(keys) > 0 {
		n := 0
		p.mu.Lock()
		for _, k := range keys[:min(chunk, len(keys))] {
			c, ok := p.ledger.Row(k)
			if !ok {
				continue
			}
			rows[n] = p.row(k, c, rows[n].Frames[:0], named)
			n++
		}
		p.mu.Unlock()
		keys = keys[min(chunk, len(keys)):]
		for i := range rows[:n] {
			fn(&rows[i])
		}
	}
	return listed
}

// row is the report row of key k, its frames appended to frames. named
// holds each process's pod and container, named once per listing.
func (p *Profiler) row(k accounting.Key, c accounting.Counters, frames []*symbolize.Frame, named map[uint32]container.Identity) Row {
	return Row{Key: k, Comm: p.comms[k.PID], Device: p.device(k), Container: p.namedOnce(k.PID, named),
		Frames: p.appendFrames(frames, k.Stack), Counters: c}
}

// namedOnce is a process's pod and container, named once per listing in
// named.
func (p *Profiler) namedOnce(pid uint32, named map[uint32]container.Identity) container.Identity {
	c, ok := named[pid]
	if !ok {
		c = p.container(pid)
		named[pid] = c
	}
	return c
}

// onGPU says whether a row is on the devices the report is limited to.
func (p *Profiler) onGPU(k accounting.Key) bool {
	if len(p.cfg.GPUs) == 0 {
		return true
	}
	return k.Kind.OnDevice() && slices.Contains(p.cfg.GPUs, int(k.Device))
}

// frames are a stack's frames; a stack interned after resolve ran (by an
// event read in between) shows its driver function and Python frames.
func (p *Profiler) frames(id accounting.StackID) []*symbolize.Frame {
	return p.appendFrames(nil, id)
}

// appendFrames appends a stack's frames to dst.
func (p *Profiler) appendFrames(dst []*symbolize.Frame, id accounting.StackID) []*symbolize.Frame {
	s := p.stacks.m[id]
	if s.frames == nil {
		// Not named yet: no reference is taken for the frames known.
		var op memory.Op
		var python []pystack.Frame
		if s.raw != nil {
			op, python = s.raw.op, s.raw.python
		}
		dst = append(dst, p.frameTable.find(driverFrame(op)))
		for _, f := range pystack.Merge(nil, python) {
			dst = append(dst, p.frameTable.find(f))
		}
		return dst
	}
	dst = slices.Grow(dst, len(s.frames))
	for _, i := range s.frames {
		dst = append(dst, p.frameTable.frames[i])
	}
	return dst
}

// device is the GPU a row's memory is on, if known.
func (p *Profiler) device(k accounting.Key) gpuinfo.Device {
	if !k.Kind.OnDevice() {
		return gpuinfo.Device{}
	}
	return p.ordinals[k.PID][int(k.Device)]
}

// currentLosses are the tracer's loss counts, or its last ones once closed.
// The caller holds p.mu.
func (p *Profiler) currentLosses() (schema.Losses, error) {
	if p.closed {
		return p.losses, nil
	}
	return p.tr.Losses()
}
