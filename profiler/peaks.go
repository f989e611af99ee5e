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
	// shares of it: what an exporter of the rows EachRow lists needs. They
	// sum to Amount. IntervalPeaks' are valid until its next call.
	Shares []accounting.PeakRow
	// Rows are the same rows named, by bytes, descending, with their
	// frames (Report's peaks only). A row's LiveBytes and LiveCount are its
	// share of the peak, and its Counters say only that: AllocBytes and
	// AllocCount are the share, nothing is freed.
	Rows []Row
}

// IntervalPeaks returns each process's peak per GPU and view during the
// interval since the previous call (since the start, at the first), and
// starts the next interval: the agent calls it once per interval. A
// process that exited during the interval has its peak: it is dropped only
// as the interval after begins (exited.go). An interval's peak is at least
// what the process held when the interval began; a process holding nothing
// all along has none. Peaks
// come by PID, GPU and view, with their Shares and no Rows (copying every
// row of the books each interval would cost the agent more than the
// peaks): an exporter finds each share's row among those EachRow lists.
// The Shares are read into the books' buffer that the next call reuses:
// they are valid until then.
// So that EachRow lists them all, the stacks of the shares are named
// before it returns: at once where the background namer was there first,
// as it mostly is; a stack new since its last run waits for it (the first
// stack through a large library for its table: 0.15 s through torch's own
// on the H200). A peak cannot be carried to a later interval as live
// bytes are. The events do not flow while the books' peaks are read
// (about 13 ns a row of the books).
func (p *Profiler) IntervalPeaks() []Peak {
	p.enrichNoted() // every row of a process read has its pod and GPUs
	p.mu.Lock()
	p.startInterval(true)
	peaks := p.peaks(p.ledger.TakeIntervalPeaks(bpfNow()), map[uint32]container.Identity{}, false)
	naming := p.sharesNaming(peaks)
	p.mu.Unlock()
	if naming {
		p.resolve()
	}
	return peaks
}

// sharesNaming says whether a stack of the peaks' shares is not named yet.
// The caller holds p.mu.
func (p *Profiler) sharesNaming(peaks []Peak) bool {
	for _, pk := range peaks {
		for _, s := range pk.Shares {
			if !p.stacks.m[s.Stack].named() {
				return true
			}
		}
	}
	return false
}

// peaks are the books' peaks, on the GPUs the reports are limited to, with
// their rows named if withRows. The caller holds p.mu.
func (p *Profiler) peaks(peaks []accounting.Peak, named map[uint32]container.Identity, withRows bool) []Peak {
	out := make([]Peak, 0, len(peaks))
	for _, pk := range peaks {
		if p.peakOnGPU(pk.PeakKey) {
			out = append(out, p.peak(pk, named, withRows))
		}
	}
	slices.SortFunc(out, func(a, b Peak) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.View, b.View))
	})
	return out
}

// peak is one of the books' peaks, its rows named if withRows. The caller
// holds p.mu.
func (p *Profiler) peak(pk accounting.Peak, named map[uint32]container.Identity, withRows bool) Peak {
	out := Peak{PID: pk.PID, Comm: p.comms[pk.PID], GPU: pk.GPU, Device: p.peakDevice(pk.PeakKey),
		Container: p.namedOnce(pk.PID, named), View: pk.View, Timestamp: pk.Time, Time: wallTime(pk.Time),
		Amount: pk.Amount, Shares: pk.Rows}
	if !withRows {
		return out
	}
	out.Rows = make([]Row, 0, len(pk.Rows))
	for _, r := range pk.Rows {
		share := accounting.Counters{AllocBytes: r.Bytes, AllocCount: r.Count}
		out.Rows = append(out.Rows, p.row(r.Key, share, nil, named))
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
func (p *Profiler) peakDevice(k accounting.PeakKey) gpuinfo.Device {
	ordinal, err := strconv.Atoi(k.GPU)
	if err != nil {
		return gpuinfo.Device{}
	}
	return p.ordinals[k.PID][ordinal]
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
