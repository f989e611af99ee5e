package tracer

// Op is the driver function a call event comes from (enum gpumem_op).
type Op uint16

// Kind is the kind of memory an allocation holds.
type Kind uint8

const (
	KindDevice  Kind = iota + 1 // device memory (cuMemAlloc and friends)
	KindHost                    // page-locked host memory
	KindManaged                 // unified memory
	KindVMM                     // physical memory of the virtual memory management API
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
	}
	return "unknown"
}

// ParseKind is the inverse of Kind.String.
func ParseKind(s string) (Kind, bool) {
	for k := KindDevice; k <= KindVMM; k++ {
		if k.String() == s {
			return k, true
		}
	}
	return 0, false
}

type opInfo struct {
	symbol string
	kind   Kind // the memory an allocation holds; zero for frees
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
}

// Symbol is the driver function's name.
func (o Op) Symbol() string {
	if info, ok := ops[o]; ok {
		return info.symbol
	}
	return "unknown"
}

// IsFree tells frees from allocations.
func (o Op) IsFree() bool { return ops[o].kind == 0 }

// Kind is the memory an allocation op hands out.
func (o Op) Kind() Kind { return ops[o].kind }

// Handles says whether the op's address is a VMM allocation handle rather
// than a pointer: handles and pointers are different name spaces.
func (o Op) Handles() bool {
	return o == Op(gpumemGpumemOpGPUMEM_OP_MEM_CREATE) || o == Op(gpumemGpumemOpGPUMEM_OP_MEM_RELEASE)
}

// CUresult values gpu-mem names in its output.
const (
	CUDASuccess     = 0
	CUDAOutOfMemory = 2
)
