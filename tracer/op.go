package tracer

import "strconv"

// Op is the driver function a call event comes from (enum gpumem_op).
type Op uint16

// Kind is the kind of memory an allocation holds.
type Kind uint8

const (
	KindDevice  Kind = iota + 1 // device memory (cuMemAlloc and friends)
	KindHost                    // page-locked host memory
	KindManaged                 // unified memory
	KindVMM                     // physical memory of the virtual memory management API
	KindTensor                  // tensors of PyTorch's caching allocator, inside device memory it holds
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
	}
	return "unknown"
}

// OnDevice says whether memory of kind k lives on one GPU.
func (k Kind) OnDevice() bool { return k == KindDevice || k == KindVMM || k == KindTensor }

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
	for k := KindDevice; k <= KindTensor; k++ {
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

// ops describes each enum gpumem_op of gadgets/include/gpumem.h.
var ops = map[Op]opInfo{
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC):                      {"cuMemAlloc_v2", KindDevice},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_PITCH):                {"cuMemAllocPitch_v2", KindDevice},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_MANAGED):              {"cuMemAllocManaged", KindManaged},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_HOST):                 {"cuMemAllocHost_v2", KindHost},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_HOST_ALLOC):                 {"cuMemHostAlloc", KindHost},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_ASYNC):                {"cuMemAllocAsync", KindDevice},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_ASYNC_PTSZ):           {"cuMemAllocAsync_ptsz", KindDevice},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC):      {"cuMemAllocFromPoolAsync", KindDevice},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ): {"cuMemAllocFromPoolAsync_ptsz", KindDevice},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_CREATE):                     {"cuMemCreate", KindVMM},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_FREE):                       {"cuMemFree_v2", 0},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_FREE_HOST):                  {"cuMemFreeHost", 0},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_FREE_ASYNC):                 {"cuMemFreeAsync", 0},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_FREE_ASYNC_PTSZ):            {"cuMemFreeAsync_ptsz", 0},
	Op(gpumemGpumemOpGPUMEM_OP_MEM_RELEASE):                    {"cuMemRelease", 0},

	// A VMM handle's extra reference (NCCL frees its buffers so).
	Op(gpumemGpumemOpGPUMEM_OP_MEM_RETAIN_ALLOCATION_HANDLE): {"cuMemRetainAllocationHandle", 0},

	// PyTorch's caching allocator, from its USDT probes.
	Op(gpumemGpumemOpGPUMEM_OP_TENSOR_ALLOC): {"pytorch:malloc", KindTensor},
	Op(gpumemGpumemOpGPUMEM_OP_TENSOR_FREE):  {"pytorch:free", 0},

	// Context calls, followed in BPF only: they say which device the
	// calling thread allocates on.
	Op(gpumemGpumemOpGPUMEM_OP_CTX_SET_CURRENT):           {"cuCtxSetCurrent", 0},
	Op(gpumemGpumemOpGPUMEM_OP_CTX_PUSH_CURRENT):          {"cuCtxPushCurrent_v2", 0},
	Op(gpumemGpumemOpGPUMEM_OP_CTX_POP_CURRENT):           {"cuCtxPopCurrent_v2", 0},
	Op(gpumemGpumemOpGPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN): {"cuDevicePrimaryCtxRetain", 0},
	Op(gpumemGpumemOpGPUMEM_OP_CTX_CREATE):                {"cuCtxCreate_v2", 0},
	Op(gpumemGpumemOpGPUMEM_OP_CTX_CREATE_V3):             {"cuCtxCreate_v3", 0},
	Op(gpumemGpumemOpGPUMEM_OP_CTX_CREATE_V4):             {"cuCtxCreate_v4", 0},
	Op(gpumemGpumemOpGPUMEM_OP_CTX_DESTROY):               {"cuCtxDestroy_v2", 0},
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
	return o >= Op(gpumemGpumemOpGPUMEM_OP_MEM_FREE) && o <= Op(gpumemGpumemOpGPUMEM_OP_MEM_RELEASE) ||
		o == Op(gpumemGpumemOpGPUMEM_OP_TENSOR_FREE)
}

// IsRetain says whether the op adds a reference to a VMM handle.
func (o Op) IsRetain() bool { return o == Op(gpumemGpumemOpGPUMEM_OP_MEM_RETAIN_ALLOCATION_HANDLE) }

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
	case Op(gpumemGpumemOpGPUMEM_OP_MEM_CREATE), Op(gpumemGpumemOpGPUMEM_OP_MEM_RELEASE),
		Op(gpumemGpumemOpGPUMEM_OP_MEM_RETAIN_ALLOCATION_HANDLE):
		return SpaceHandle
	case Op(gpumemGpumemOpGPUMEM_OP_TENSOR_ALLOC), Op(gpumemGpumemOpGPUMEM_OP_TENSOR_FREE):
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

// GPU names where memory of kind k made on device lives: the device
// ordinal, "host" for page-locked host memory, "managed" for unified
// memory, which migrates, and "unknown".
func GPU(k Kind, device int32) string {
	switch {
	case k == KindHost, device == DeviceHost:
		return "host"
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
