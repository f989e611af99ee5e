package profiler

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
)

// Peak is the most memory one process held at once on one GPU in one view,
// and the stacks that held it: what filled memory at its worst moment,
// which the live bytes of a report, taken at another moment, miss. The
// two views overlap (a tensor lies in a segment of the driver's), so no
// total adds the peaks of both; nor do the peaks of one process on two
// GPUs, or of two processes, add up to a peak of them together: each is
// reached at its own moment.
type Peak struct {
	PID       uint32
	Comm      string
	GPU       string         // where, as Row.GPU labels rows: a device ordinal, "host", "managed" or "unknown"
	Device    gpuinfo.Device // the GPU, where the driver says which it is
	Container container.Identity
	View      memory.View
	// Timestamp is the BPF timestamp (ns since boot) of the event that
	// reached the peak, the first if it was reached again; for an
	// interval's peak at the level the interval began with (held all
	// along), the interval's start. Time is the same on the wall clock.
	Timestamp uint64
	Time      time.Time
	// Amount is the memory held at the peak: Bytes, and Count allocations.
	accounting.Amount
	// Shares are the rows holding memory at the peak, by key, with their
	// shares of it: what an exporter of a snapshot's rows needs. They sum
	// to Amount.
	Shares []accounting.PeakRow
	// Rows are the same rows named, by bytes, descending, with their
	// frames (Report's peaks only). A row's LiveBytes and LiveCount are its
	// share of the peak, and its Counters say only that: AllocBytes and
	// AllocCount are the share, nothing is freed.
	Rows []Row
}

// peaks are the books' peaks, on the GPUs the reports are limited to, by
// PID, GPU and view, with their rows named if withRows. The processes are
// the snapshot's.
func (p *Profiler) peaks(s *Snapshot, peaks []accounting.Peak, withRows bool) []Peak {
	out := make([]Peak, 0, len(peaks))
	for _, pk := range peaks {
		if p.peakOnGPU(pk.PeakKey) {
			out = append(out, p.peak(s.procs[pk.PID], pk, withRows))
		}
	}
	slices.SortFunc(out, func(a, b Peak) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.View, b.View))
	})
	return out
}

// peak is one of the books' peaks of process proc, its rows named if
// withRows.
func (p *Profiler) peak(proc *process, pk accounting.Peak, withRows bool) Peak {
	out := Peak{PID: pk.PID, Comm: proc.comm, GPU: pk.GPU, Device: proc.peakDevice(pk.PeakKey),
		Container: proc.container, View: pk.View, Timestamp: pk.Time, Time: wallTime(pk.Time),
		Amount: pk.Amount, Shares: pk.Rows}
	if !withRows {
		return out
	}
	out.Rows = make([]Row, 0, len(pk.Rows))
	for _, r := range pk.Rows {
		share := accounting.Counters{AllocBytes: r.Bytes, AllocCount: r.Count}
		out.Rows = append(out.Rows, proc.row(r.Key, share, p.stacks.stackFrames(r.Stack)))
	}
	sortByLive(out.Rows)
	return out
}

// peakOnGPU is onGPU for a peak: whether its GPU is one the reports are
// limited to.
func (p *Profiler) peakOnGPU(k accounting.PeakKey) bool {
	if len(p.cfg.GPUs) == 0 {
		return true
	}
	return slices.ContainsFunc(p.cfg.GPUs, func(gpu int) bool { return strconv.Itoa(gpu) == k.GPU })
}

// peakDevice is the GPU a peak is on, if the driver says which it is.
func (p *process) peakDevice(k accounting.PeakKey) gpuinfo.Device {
	ordinal, err := strconv.Atoi(k.GPU)
	if err != nil {
		return gpuinfo.Device{}
	}
	return p.ordinals[ordinal]
}

// bpfNow is the time on the clock of BPF timestamps (bpf_ktime_get_ns).
func bpfNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // the clock exists on every Linux
	}
	return uint64(ts.Nano())
}

// wallTime is a BPF timestamp on the wall clock.
func wallTime(ts uint64) time.Time {
	return time.Now().Add(-time.Duration(int64(bpfNow()) - int64(ts)))
}
