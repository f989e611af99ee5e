package snapshot

import (
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/schema"
)

// Totals are the books summed per process, kind and device: what metrics
// need, without resolving a stack.
type Totals struct {
	Series       []Series
	Failures     []SeriesFailures
	Losses       schema.Losses
	LostBytes    uint64 // of the driver allocations among the losses, never charged
	UnknownFrees uint64
	Events       uint64 // events read
	// The on-demand tensor views, the
	// frees of tensors made before their view began, and how many views
	// the budget switched off.
	TensorViews     []TensorView
	FreesBeforeView uint64
	BudgetExceeded  uint64
	// The driver views the budget switched off: those of processes not
	// dropped yet, and how many in all.
	DriverViewsOff       []DriverViewOff
	DriverBudgetExceeded uint64
	// GPUMemory is what NVML says the GPUs hold (Snapshot.GPUMemory).
	GPUMemory *GPUMemory
	// State is the agent's kept state, when it keeps one.
	State *State
}

// State is what an agent keeps for the next one (its state directory).
type State struct {
	JournalBytes int64
	// Refused says why the state a previous agent left was not continued
	// (a short reason: version, object, boot, ring, maps, corrupt); empty
	// when it was, or there was none.
	Refused string
}

// SeriesKey names a process's memory of one kind on one device: the key
// of the rows summed over their stacks.
type SeriesKey struct {
	PID    uint32
	Kind   memory.Kind
	Device int32
}

// SeriesOf is the series of a row.
func SeriesOf(k accounting.Key) SeriesKey { return SeriesKey{k.PID, k.Kind, k.Device} }

// GPU is where the series' memory lives (memory.GPU).
func (k SeriesKey) GPU() string { return memory.GPU(k.Kind, k.Device) }

// Series is one process's memory of one kind on one device.
type Series struct {
	SeriesKey
	Comm      string
	Container container.Identity
	Since     time.Time // its process's Since: its counters' start
	accounting.Counters
}

// SeriesFailures counts one process's failed allocations of one kind on
// one device with one result.
type SeriesFailures struct {
	SeriesKey
	Comm      string
	Container container.Identity
	Since     time.Time // its process's Since: its counts' start
	Result    int32
	Count     uint64
}
