package snapshot

import (
	"github.com/gpu-mem/gpu-mem/accounting"
	"github.com/gpu-mem/gpu-mem/container"
	"github.com/gpu-mem/gpu-mem/gpuinfo"
	"github.com/gpu-mem/gpu-mem/memory"
	"github.com/gpu-mem/gpu-mem/symbolize"
)

// The categories of a breakdown, as every output names them.
const (
	Parameters     = "parameters"      // tensors made building, moving or loading a model
	Gradients      = "gradients"       // tensors a backward pass made, still live: the parameters' .grad
	OptimizerState = "optimizer_state" // tensors an optimizer made
	KVCache        = "kv_cache"        // a KV cache's tensors
	Activations    = "activations"     // every other tensor
	CUDAGraphPools = "cuda_graph_pools"
	// AllocatorCache is the bytes of PyTorch's segments that hold no
	// tensor: its segments less its tensors, with the tensor view on.
	AllocatorCache = "allocator_cache"
	// AllocatorSegments are PyTorch's segments, whole: without the tensor
	// view, what is in them is unknown.
	AllocatorSegments = "allocator_segments"
	// LibraryWorkspaces is memory a library took from the driver itself
	// (cuBLAS, cuDNN, NCCL, ...), outside PyTorch's allocator; Part.Library
	// says which.
	LibraryWorkspaces = "library_workspaces"
	OtherDriver       = "other_driver" // driver memory no rule claims
	Context           = "context"
	Modules           = "modules"
	DriverInternal    = "driver_internal"
)

// Breakdown is where one process's memory on one GPU went, by category.
// Its parts sum to what NVML (nvidia-smi) says the process uses there when
// NVML is read (NVML), else to its driver view.
type Breakdown struct {
	PID       uint32
	GPU       string
	Comm      string
	Device    gpuinfo.Device // the GPU, where the driver says which it is
	Container container.Identity
	Parts     []Part // by bytes, descending
	// NVML says the parts hold NVML's number: its contexts, modules and
	// driver internals are among them.
	NVML bool
	// TensorView says whether the process's tensors are known: without
	// them its allocator's segments are one part, AllocatorSegments.
	TensorView bool
	// Fragmentation is the free space inside the allocator's segments;
	// nil without the tensor view.
	Fragmentation *Fragmentation
}

// Bytes is the sum of the parts.
func (b Breakdown) Bytes() uint64 {
	var n uint64
	for _, p := range b.Parts {
		n += p.Bytes
	}
	return n
}

// Part is one category of a breakdown.
type Part struct {
	Category string
	Library  string // LibraryWorkspaces' library: "cublas", "nccl", a .so's name
	Bytes    uint64
	Top      []Holding // the stacks holding the most of it, at most MaxHolders
	// Keys are the rows it is made of: a reader filters its stacks by
	// them (the HTML report's flame graph of one part).
	Keys []accounting.Key
}

// Name is the part as one word: the category, and the library after a
// slash.
func (p Part) Name() string {
	if p.Library == "" {
		return p.Category
	}
	return p.Category + "/" + p.Library
}

// MaxHolders is how many stacks a part names.
const MaxHolders = 3

// Holding is a stack holding part of a category.
type Holding struct {
	Stack  accounting.StackID
	Kind   memory.Kind
	Frames []*symbolize.Frame // innermost first, read-only
	Bytes  uint64
}

// Fragmentation is the free space inside a process's allocator segments
// on one GPU, as PyTorch's allocator sees it (torch.cuda.memory_snapshot's
// inactive blocks), outside its graph pools.
type Fragmentation struct {
	FreeInSegments   uint64 // "reserved but unallocated"
	LargestFreeBlock uint64 // the largest run of free bytes in one segment
}

// The verdicts of an out-of-memory: why the GPU had no room.
const (
	// Demand: the process's own parts add up to the GPU.
	Demand = "demand"
	// FragmentationVerdict: PyTorch's cache held the bytes asked for, free,
	// but in no block large enough.
	FragmentationVerdict = "fragmentation"
	// AnotherProcess: what was missing is held by other processes.
	AnotherProcess = "another_process"
	// Limit: the driver refused though the GPU had the bytes free (a MIG
	// slice, or a limit below the GPU's size).
	Limit = "limit"
)

// Verdict is why one out-of-memory happened, as of that moment.
type Verdict struct {
	Verdict string // Demand, FragmentationVerdict, AnotherProcess or Limit
	Why     string // one sentence: the numbers behind the verdict
	Asked   uint64 // what the refused call asked for
	// Breakdown is the process's on the GPU then: its rows, and NVML's
	// parts read just after.
	Breakdown     Breakdown
	Fragmentation *Fragmentation // nil without the tensor view
	// Free is what NVML said the GPU had free just after; Neighbours the
	// other processes on it, by bytes (none known without NVML).
	Free       uint64
	Neighbours []Neighbour
}

// Neighbour is another process on the GPU at an out-of-memory, with its
// pod where the snapshot knows it.
type Neighbour struct {
	ProcessMemory
	Container container.Identity
}
