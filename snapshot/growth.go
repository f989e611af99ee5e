package snapshot

import (
	"time"

	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// Growing is a row whose low-water mark (Entry.Low: the least it held in
// an interval) rose in each of the last intervals of a detection window:
// memory kept, more of it interval after interval, whatever the row does
// in between. Set by its reader (growth.Detector), nil until.
type Growing struct {
	accounting.Key
	Comm      string
	Device    gpuinfo.Device
	Container container.Identity
	Frames    []*symbolize.Frame // innermost first, shared: read-only
	// Low is the row's low-water mark in the last interval.
	Low uint64
	// Grew is how much the low-water mark rose over Window, the detection
	// window (its intervals' span); BytesPerSecond is Grew over Window.
	Grew           uint64
	Window         time.Duration
	BytesPerSecond float64
	// Since is when the row began to grow: the end of the last interval
	// whose low-water mark did not rise; At the end of the interval it was
	// found growing at.
	Since, At time.Time
}

// Exhaustion is when one GPU's memory runs out at the rate its rows grow
// (Growing): its free memory, as NVML says, over the sum of its
// processes' rates. Absent for a GPU nothing grows on.
type Exhaustion struct {
	GPU  int    // NVML's index, as GPUMemory's
	UUID string // "GPU-..."
	// Free is the GPU's memory that no process uses, as NVML says
	// (nvidia-smi's memory.free), and Slack the free space inside the
	// allocators' segments that a process whose tensors grow while its
	// segments do not fills first.
	Free, Slack    uint64
	BytesPerSecond float64
	Seconds        float64           // (Free + Slack) / BytesPerSecond
	Processes      []ExhaustionShare // by rate, descending
}

// ExhaustionShare is one process's part of a GPU's growth.
type ExhaustionShare struct {
	PID            uint32
	Comm           string
	Container      container.Identity
	BytesPerSecond float64
	// Share is BytesPerSecond over the GPU's: how much of the time left
	// the process takes.
	Share float64
	// Frames are the process's fastest growing stack's there, innermost
	// first: read-only.
	Frames []*symbolize.Frame
}
