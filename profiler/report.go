package profiler

import (
	"slices"
	"sort"
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/operators/k8smeta"
	"github.com/gpu-mem/gpu-mem/pystack"
	"github.com/gpu-mem/gpu-mem/symbolize"
	"github.com/gpu-mem/gpu-mem/tracer"
)

// Report is the books at one moment, with stacks resolved.
type Report struct {
	Time      time.Time
	Rows      []Row     // by live bytes, then allocated bytes, descending
	Failures  []Failure // by count, descending
	OOMs      []OOM     // out-of-memory snapshots, oldest first, the latest MaxOOMs
	Losses    tracer.Losses
	Ledger    accounting.Stats
	Python    PythonStats
	Events    uint64   // events read
	Libraries []string // driver libraries attached
}

// Row is what one stack of one process did with one kind of memory.
type Row struct {
	accounting.Key
	Comm      string
	Device    gpuinfo.Device     // the GPU, where the driver says which it is
	Container k8smeta.Container  // the pod and container, from the process's cgroup
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
	p.resolve()
	p.mu.Lock()
	defer p.mu.Unlock()
	losses, err := p.currentLosses()
	snap := p.ledger.Snapshot()
	r := Report{Time: time.Now(), Losses: losses, Ledger: snap.Stats, Python: p.pyStats, Events: p.events, OOMs: slices.Clone(p.ooms)}
	for _, lib := range p.attached {
		r.Libraries = append(r.Libraries, lib.Path)
	}
	sort.Strings(r.Libraries)
	for k, c := range snap.Rows {
		if !p.onGPU(k) {
			continue
		}
		r.Rows = append(r.Rows, Row{Key: k, Comm: p.comms[k.PID], Device: p.device(k), Container: p.containers[k.PID].Named(p.cfg.Pods), Frames: p.frames(k.Stack), Counters: c})
	}
	sort.Slice(r.Rows, func(i, j int) bool {
		a, b := r.Rows[i], r.Rows[j]
		if a.LiveBytes() != b.LiveBytes() {
			return a.LiveBytes() > b.LiveBytes()
		}
		if a.AllocBytes != b.AllocBytes {
			return a.AllocBytes > b.AllocBytes
		}
		return a.PID < b.PID
	})
	for k, f := range snap.Failures {
		if !p.onGPU(k.Key) {
			continue
		}
		r.Failures = append(r.Failures, Failure{FailureKey: k, Comm: p.comms[k.PID], Frames: p.frames(k.Stack), Failures: f})
	}
	sort.Slice(r.Failures, func(i, j int) bool { return r.Failures[i].Count > r.Failures[j].Count })
	return r, err
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
	s := p.stacks.m[id]
	if s.frames != nil {
		return s.frames
	}
	var op tracer.Op
	var python []pystack.Frame
	if s.raw != nil {
		op, python = s.raw.op, s.raw.python
	}
	return p.internFrames(op, pystack.Merge(nil, python))
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
func (p *Profiler) currentLosses() (tracer.Losses, error) {
	if p.closed {
		return p.losses, nil
	}
	return p.tr.Losses()
}
