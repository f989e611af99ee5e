package tracer

import (
	"testing"

	"github.com/gpu-mem/gpu-mem/memory"
)

// TestOpsAgreeWithBPF: package memory's ops are enum gpumem_op's values,
// which the BPF program sends, and name the functions Attach probes.
func TestOpsAgreeWithBPF(t *testing.T) {
	for op, bpf := range map[memory.Op]gpumemGpumemOp{
		memory.OpMemAlloc:                  gpumemGpumemOpGPUMEM_OP_MEM_ALLOC,
		memory.OpMemAllocPitch:             gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_PITCH,
		memory.OpMemAllocManaged:           gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_MANAGED,
		memory.OpMemAllocHost:              gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_HOST,
		memory.OpMemHostAlloc:              gpumemGpumemOpGPUMEM_OP_MEM_HOST_ALLOC,
		memory.OpMemAllocAsync:             gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_ASYNC,
		memory.OpMemAllocAsyncPtsz:         gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_ASYNC_PTSZ,
		memory.OpMemAllocFromPoolAsync:     gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC,
		memory.OpMemAllocFromPoolAsyncPtsz: gpumemGpumemOpGPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
		memory.OpMemCreate:                 gpumemGpumemOpGPUMEM_OP_MEM_CREATE,
		memory.OpMemFree:                   gpumemGpumemOpGPUMEM_OP_MEM_FREE,
		memory.OpMemFreeHost:               gpumemGpumemOpGPUMEM_OP_MEM_FREE_HOST,
		memory.OpMemFreeAsync:              gpumemGpumemOpGPUMEM_OP_MEM_FREE_ASYNC,
		memory.OpMemFreeAsyncPtsz:          gpumemGpumemOpGPUMEM_OP_MEM_FREE_ASYNC_PTSZ,
		memory.OpMemRelease:                gpumemGpumemOpGPUMEM_OP_MEM_RELEASE,
		memory.OpTensorAlloc:               gpumemGpumemOpGPUMEM_OP_TENSOR_ALLOC,
		memory.OpTensorFree:                gpumemGpumemOpGPUMEM_OP_TENSOR_FREE,
		memory.OpTensorOOM:                 gpumemGpumemOpGPUMEM_OP_TENSOR_OOM,
		memory.OpMemRetainAllocationHandle: gpumemGpumemOpGPUMEM_OP_MEM_RETAIN_ALLOCATION_HANDLE,
		memory.OpCtxSetCurrent:             gpumemGpumemOpGPUMEM_OP_CTX_SET_CURRENT,
		memory.OpCtxPushCurrent:            gpumemGpumemOpGPUMEM_OP_CTX_PUSH_CURRENT,
		memory.OpCtxPopCurrent:             gpumemGpumemOpGPUMEM_OP_CTX_POP_CURRENT,
		memory.OpDevicePrimaryCtxRetain:    gpumemGpumemOpGPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN,
		memory.OpCtxCreate:                 gpumemGpumemOpGPUMEM_OP_CTX_CREATE,
		memory.OpCtxCreateV3:               gpumemGpumemOpGPUMEM_OP_CTX_CREATE_V3,
		memory.OpCtxCreateV4:               gpumemGpumemOpGPUMEM_OP_CTX_CREATE_V4,
		memory.OpCtxDestroy:                gpumemGpumemOpGPUMEM_OP_CTX_DESTROY,
		memory.OpModuleLoad:                gpumemGpumemOpGPUMEM_OP_MODULE_LOAD,
		memory.OpModuleLoadData:            gpumemGpumemOpGPUMEM_OP_MODULE_LOAD_DATA,
		memory.OpModuleLoadDataEx:          gpumemGpumemOpGPUMEM_OP_MODULE_LOAD_DATA_EX,
		memory.OpModuleLoadFatBinary:       gpumemGpumemOpGPUMEM_OP_MODULE_LOAD_FAT_BINARY,
		memory.OpLibraryLoadData:           gpumemGpumemOpGPUMEM_OP_LIBRARY_LOAD_DATA,
		memory.OpLibraryLoadFromFile:       gpumemGpumemOpGPUMEM_OP_LIBRARY_LOAD_FROM_FILE,
		memory.OpModuleUnload:              gpumemGpumemOpGPUMEM_OP_MODULE_UNLOAD,
		memory.OpLibraryUnload:             gpumemGpumemOpGPUMEM_OP_LIBRARY_UNLOAD,
	} {
		if uint16(op) != uint16(bpf) {
			t.Errorf("%s is %d in Go, %d in BPF", op.Symbol(), op, bpf)
		}
	}
	if n := len(memory.Ops()); n != 35 {
		t.Errorf("%d ops named, want every one of the 35", n)
	}
}
