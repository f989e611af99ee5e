// Package memory is gpu-mem's vocabulary of GPU memory, shared by the
// tracer, the books and every output: the kinds of memory, the two views
// of it, the driver functions (ops) that allocate and free it, and where
// it lives.
package memory

import (
	"strconv"
	"strings"
)

// Op is the driver function a call event comes from. The values are those
// of enum gpumem_op (gadgets/include/gpumem.h), which the BPF program
// sends; package tracer checks that they agree.
type Op uint16

const (
	OpMemAlloc                  Op = 1
	OpMemAllocPitch             Op = 2
	OpMemAllocManaged           Op = 3
	OpMemAllocHost              Op = 4
	OpMemHostAlloc              Op = 5
	OpMemAllocAsync             Op = 6
	OpMemAllocAsyncPtsz         Op = 7
	OpMemAllocFromPoolAsync     Op = 8
	OpMemAllocFromPoolAsyncPtsz Op = 9
	OpMemCreate                 Op = 10
	OpMemFree                   Op = 11
	OpMemFreeHost               Op = 12
	OpMemFreeAsync              Op = 13
	OpMemFreeAsyncPtsz          Op = 14
	OpMemRelease                Op = 15
	OpTensorAlloc               Op = 16
	OpTensorFree                Op = 17
	OpTensorOOM                 Op = 18
	OpMemRetainAllocationHandle Op = 24
	OpCtxSetCurrent             Op = 32
	OpCtxPushCurrent            Op = 33
	OpCtxPopCurrent             Op = 34
	OpDevicePrimaryCtxRetain    Op = 35
	OpCtxCreate                 Op = 36
	OpCtxCreateV3               Op = 37
	OpCtxCreateV4               Op = 38
	OpCtxDestroy                Op = 39
	OpModuleLoad                Op = 48
	OpModuleLoadData            Op = 49
	OpModuleLoadDataEx          Op = 50
	OpModuleLoadFatBinary       Op = 51
	OpLibraryLoadData           Op = 52
	OpLibraryLoadFromFile       Op = 53
	OpModuleUnload              Op = 54
	OpLibraryUnload             Op = 55
)

// Kind is the kind of memory an allocation holds.
type Kind uint8

const (
	KindDevice  Kind = iota + 1 // device memory (cuMemAlloc and friends)
	KindHost                    // page-locked host memory
	KindManaged                 // unified memory
	KindVMM                     // physical memory of the virtual memory management API
	KindTensor                  // tensors of PyTorch's caching allocator, inside device memory it holds
	// KindContext is a CUDA context's device memory: what NVML says its
	// process's use grew by across its creation (cuDevicePrimaryCtxRetain,
	// cuCtxCreate), charged to the stack that made it.
	KindContext
	// KindDriverInternal is what NVML says a process uses on a GPU beyond
	// the memory gpu-mem traced and the contexts and modules it saw made
	// there: kernel images loaded lazily (at a kernel's first launch), the
	// driver's internal buffers, and contexts made before gpu-mem attached.
	KindDriverInternal
	// KindUntraced is what NVML says a process gpu-mem does not trace
	// uses on a GPU (one in another container, out of the agent's reach).
	KindUntraced
	// KindModule is the kernel images of a module or library a process
	// loaded (cuModuleLoad*, cuLibraryLoad*): what NVML says its use grew
	// by across the load, charged to the stack that loaded it until its
	// unload. Only eager loading (CUDA_MODULE_LOADING=EAGER) puts images on
	// the device in the load; lazy loading, the default since CUDA 12.2,
	// loads each kernel at its first launch, into KindDriverInternal.
	KindModule

	lastKind = KindModule
)

func (k Kind) String() string {
	switch k {
	case KindDevice:
		return "device"
	case KindHost:
		return "host-pinned"
	case KindManaged:
		return "managed"
	case KindVMM:
		return "vmm"
	case KindTensor:
		return "tensor"
	case KindContext:
		return "context"
	case KindDriverInternal:
		return "driver-internal"
	case KindUntraced:
		return "untraced"
	case KindModule:
		return "module"
	}
	return "unknown"
}

// OnDevice says whether memory of kind k lives on one GPU.
func (k Kind) OnDevice() bool { return k != KindHost && k != KindManaged }

// FromNVML says whether memory of kind k is known from NVML's numbers
// rather than from traced allocations.
func (k Kind) FromNVML() bool {
	return k == KindContext || k == KindModule || k == KindDriverInternal || k == KindUntraced
}

// AllocatedOnGPU says whether memory of kind k on device is what
// Inspektor Gadget's CUDA gadgets count as GPU memory (top_cuda_memory's
// host_raw 0, the guide dashboard's panels): allocated through the driver
// (not NVML's parts, not a tensor inside a segment) and not in the host's
// RAM (GPU's GPUHost).
func AllocatedOnGPU(k Kind, device int32) bool {
	return k.View() == ViewDriver && !k.FromNVML() && GPU(k, device) != GPUHost
}

// FromNVMLWithStack says whether memory of kind k is known from NVML's
// numbers and charged to the stack of the call that made it (a context, a
// module), rather than to a row of NVML's own.
func (k Kind) FromNVMLWithStack() bool { return k == KindContext || k == KindModule }

// View is one of the two accounts gpu-mem keeps of a process's memory. They
// overlap, so no total ever adds them: a tensor lies inside a segment that
// PyTorch's caching allocator got from the driver, and its bytes are in
// both.
type View uint8

const (
	// ViewDriver is what the driver handed out, every kind but tensors:
	// what the GPU really holds (what nvidia-smi's per-process figure
	// grows with), the default of every output.
	ViewDriver View = iota
	// ViewTensor is what PyTorch's tensors hold: what the code asked for.
	ViewTensor
)

// Views are both views, the default first.
var Views = []View{ViewDriver, ViewTensor}

// View is the view memory of kind k is counted in. This is the one place
// that says which kinds belong to which view.
func (k Kind) View() View {
	if k == KindTensor {
		return ViewTensor
	}
	return ViewDriver
}

func (v View) String() string {
	if v == ViewTensor {
		return "tensor"
	}
	return "driver"
}

// ParseView is the inverse of View.String.
func ParseView(s string) (View, bool) {
	for _, v := range Views {
		if v.String() == s {
			return v, true
		}
	}
	return 0, false
}

// ParseKind is the inverse of Kind.String.
func ParseKind(s string) (Kind, bool) {
	for k := KindDevice; k <= lastKind; k++ {
		if k.String() == s {
			return k, true
		}
	}
	return 0, false
}

type opInfo struct {
	symbol string
	kind   Kind // the memory an allocation holds; zero for other calls
}

// ops describes each op.
var ops = map[Op]opInfo{
	OpMemAlloc:                  {"cuMemAlloc_v2", KindDevice},
	OpMemAllocPitch:             {"cuMemAllocPitch_v2", KindDevice},
	OpMemAllocManaged:           {"cuMemAllocManaged", KindManaged},
	OpMemAllocHost:              {"cuMemAllocHost_v2", KindHost},
	OpMemHostAlloc:              {"cuMemHostAlloc", KindHost},
	OpMemAllocAsync:             {"cuMemAllocAsync", KindDevice},
	OpMemAllocAsyncPtsz:         {"cuMemAllocAsync_ptsz", KindDevice},
	OpMemAllocFromPoolAsync:     {"cuMemAllocFromPoolAsync", KindDevice},
	OpMemAllocFromPoolAsyncPtsz: {"cuMemAllocFromPoolAsync_ptsz", KindDevice},
	OpMemCreate:                 {"cuMemCreate", KindVMM},
	OpMemFree:                   {"cuMemFree_v2", 0},
	OpMemFreeHost:               {"cuMemFreeHost", 0},
	OpMemFreeAsync:              {"cuMemFreeAsync", 0},
	OpMemFreeAsyncPtsz:          {"cuMemFreeAsync_ptsz", 0},
	OpMemRelease:                {"cuMemRelease", 0},

	// A VMM handle's extra reference (NCCL frees its buffers so).
	OpMemRetainAllocationHandle: {"cuMemRetainAllocationHandle", 0},

	// PyTorch's caching allocator, from its USDT probes.
	OpTensorAlloc: {"pytorch:malloc", KindTensor},
	OpTensorFree:  {"pytorch:free", 0},
	// Its out-of-memory, reported by c10::reportOutOfMemoryToProfiler
	// before it raises: also when a limit of its own refused, which the
	// driver never sees.
	OpTensorOOM: {"pytorch:out_of_memory", KindTensor},

	// Context calls, followed in BPF only: they say which device the
	// calling thread allocates on.
	OpCtxSetCurrent:          {"cuCtxSetCurrent", 0},
	OpCtxPushCurrent:         {"cuCtxPushCurrent_v2", 0},
	OpCtxPopCurrent:          {"cuCtxPopCurrent_v2", 0},
	OpDevicePrimaryCtxRetain: {"cuDevicePrimaryCtxRetain", 0},
	OpCtxCreate:              {"cuCtxCreate_v2", 0},
	OpCtxCreateV3:            {"cuCtxCreate_v3", 0},
	OpCtxCreateV4:            {"cuCtxCreate_v4", 0},
	OpCtxDestroy:             {"cuCtxDestroy_v2", 0},

	// Module and library loads, sized by NVML; the unloads end them.
	OpModuleLoad:          {"cuModuleLoad", 0},
	OpModuleLoadData:      {"cuModuleLoadData", 0},
	OpModuleLoadDataEx:    {"cuModuleLoadDataEx", 0},
	OpModuleLoadFatBinary: {"cuModuleLoadFatBinary", 0},
	OpLibraryLoadData:     {"cuLibraryLoadData", 0},
	OpLibraryLoadFromFile: {"cuLibraryLoadFromFile", 0},
	OpModuleUnload:        {"cuModuleUnload", 0},
	OpLibraryUnload:       {"cuLibraryUnload", 0},
}

// Ops are every op, by the driver function's name.
func Ops() map[string]Op {
	bySymbol := make(map[string]Op, len(ops))
	for op, info := range ops {
		bySymbol[info.symbol] = op
	}
	return bySymbol
}

// GraphPool names the frame innermost in the stacks of allocations made for
// a private pool of PyTorch's allocator (a CUDA graph's): its segments and
// tensors. Outputs tell a graph's pool from the allocator's cache by it, and
// flame graphs show it under the stack that captured the graph.
const GraphPool = "[CUDA graph pool]"

// ThreadFrame is the outermost frame of a stack without Python frames made
// on a thread other than its process's first: the thread's name, such as
// PyTorch's autograd threads' "pt_autograd_0" (a backward pass).
func ThreadFrame(name string) string { return threadPrefix + name + "]" }

const threadPrefix = "[thread "

// ThreadOf is the thread a frame function names, if it is a ThreadFrame.
func ThreadOf(function string) (name string, ok bool) {
	name, ok = strings.CutPrefix(function, threadPrefix)
	if !ok || !strings.HasSuffix(name, "]") {
		return "", false
	}
	return name[:len(name)-1], true
}

// InAllocator says whether a function, by its demangled name, is PyTorch's
// CUDA caching allocator's (its C++ namespace, in torch's libc10_cuda.so
// and in tests/simtorch): a driver allocation whose stack passes through
// one (DeviceCachingAllocator::alloc_block and the like; ExpandableSegment
// for expandable segments) is a segment of the allocator.
func InAllocator(function string) bool {
	return strings.Contains(function, "CUDACachingAllocator::")
}

// Symbol is the driver function's name.
func (o Op) Symbol() string {
	if info, ok := ops[o]; ok {
		return info.symbol
	}
	return "unknown"
}

// IsFree tells frees from allocations; events carry nothing else.
func (o Op) IsFree() bool {
	return o >= OpMemFree && o <= OpMemRelease ||
		o == OpTensorFree
}

// MakesContext says whether the op's event is a context made: its
// address the context, its device the context's.
func (o Op) MakesContext() bool {
	return o == OpDevicePrimaryCtxRetain || o == OpCtxCreate || o == OpCtxCreateV3 || o == OpCtxCreateV4
}

// LoadsModule says whether the op's event is a module or library loaded:
// its address the handle, its device the calling thread's context's.
func (o Op) LoadsModule() bool { return o >= OpModuleLoad && o <= OpLibraryLoadFromFile }

// UnloadsModule says whether the op's event is a module or library
// unloaded: its address the handle.
func (o Op) UnloadsModule() bool { return o == OpModuleUnload || o == OpLibraryUnload }

// IsRetain says whether the op adds a reference to a VMM handle.
func (o Op) IsRetain() bool { return o == OpMemRetainAllocationHandle }

// Kind is the memory an allocation op hands out.
func (o Op) Kind() Kind { return ops[o].kind }

// Space is the name space of an event's address: a driver pointer, a VMM
// handle, or a tensor's pointer, which lies inside a driver allocation and
// is often equal to its pointer.
type Space uint8

const (
	SpacePointer Space = iota
	SpaceHandle
	SpaceTensor
)

// Space says which name space the op's address is in.
func (o Op) Space() Space {
	switch o {
	case OpMemCreate, OpMemRelease,
		OpMemRetainAllocationHandle:
		return SpaceHandle
	case OpTensorAlloc, OpTensorFree:
		return SpaceTensor
	}
	return SpacePointer
}

// DeviceUnknown is the device of an allocation made in a context gpu-mem
// did not see created (before it attached), and of host and managed memory.
const DeviceUnknown = -1

// DeviceHost is the device of VMM memory made on the host (cuMemCreate
// with a host location, as NCCL makes some of its buffers).
const DeviceHost = -2

// GPUHost is GPU's name for memory in the host's RAM: page-locked host
// memory and VMM memory made on the host. It is not the GPUs' memory.
const GPUHost = "host"

// GPU names where memory of kind k made on device lives: the device
// ordinal, GPUHost for page-locked host memory, "managed" for unified
// memory, which migrates, and "unknown".
func GPU(k Kind, device int32) string {
	switch {
	case k == KindHost, device == DeviceHost:
		return GPUHost
	case k == KindManaged:
		return "managed"
	case device < 0:
		return "unknown"
	}
	return strconv.Itoa(int(device))
}

// CUresult values gpu-mem names in its output.
const (
	CUDASuccess     = 0
	CUDAOutOfMemory = 2
)
