package snapshot

import (
	"time"

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
	// frames (the run's peaks only). A row's LiveBytes and LiveCount are its
	// share of the peak, and its Counters say only that: AllocBytes and
	// AllocCount are the share, nothing is freed.
	Rows []Row
}
