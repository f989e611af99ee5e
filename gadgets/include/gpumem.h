/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Types shared by program.bpf.c and the Go loader (tracer/), which reads the
 * generated bindings of these structs and enums (make generate). */
#ifndef GPUMEM_H
#define GPUMEM_H

/* 127 frames: the most bpf_get_stack returns with the default
 * kernel.perf_event_max_stack. */
#define GPUMEM_MAX_STACK_DEPTH 127
/* Python frames kept per event, innermost first. */
#define GPUMEM_MAX_PY_FRAMES 128
#define GPUMEM_MAX_INFLIGHT 16384
#define GPUMEM_MAX_PROCESSES 16384
#define GPUMEM_RINGBUF_BYTES (16 * 1024 * 1024)

/* One op per probed driver symbol; the attach cookie of its probes. */
enum gpumem_op {
	GPUMEM_OP_MEM_ALLOC = 1,                 /* cuMemAlloc_v2 */
	GPUMEM_OP_MEM_ALLOC_PITCH,               /* cuMemAllocPitch_v2 */
	GPUMEM_OP_MEM_ALLOC_MANAGED,             /* cuMemAllocManaged */
	GPUMEM_OP_MEM_ALLOC_HOST,                /* cuMemAllocHost_v2 */
	GPUMEM_OP_MEM_HOST_ALLOC,                /* cuMemHostAlloc */
	GPUMEM_OP_MEM_ALLOC_ASYNC,               /* cuMemAllocAsync */
	GPUMEM_OP_MEM_ALLOC_ASYNC_PTSZ,          /* cuMemAllocAsync_ptsz */
	GPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC,     /* cuMemAllocFromPoolAsync */
	GPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, /* cuMemAllocFromPoolAsync_ptsz */
	GPUMEM_OP_MEM_CREATE,                    /* cuMemCreate */
	GPUMEM_OP_MEM_FREE,                      /* cuMemFree_v2 */
	GPUMEM_OP_MEM_FREE_HOST,                 /* cuMemFreeHost */
	GPUMEM_OP_MEM_FREE_ASYNC,                /* cuMemFreeAsync */
	GPUMEM_OP_MEM_FREE_ASYNC_PTSZ,           /* cuMemFreeAsync_ptsz */
	GPUMEM_OP_MEM_RELEASE,                   /* cuMemRelease */

	/* PyTorch's caching allocator (libc10_cuda.so USDT probes): tensors. */
	GPUMEM_OP_TENSOR_ALLOC,                  /* pytorch:malloc */
	GPUMEM_OP_TENSOR_FREE,                   /* pytorch:free */
	GPUMEM_OP_TENSOR_OOM,                    /* c10::reportOutOfMemoryToProfiler: the allocator out of memory */

	/* A VMM handle's extra reference: each takes one more cuMemRelease. */
	GPUMEM_OP_MEM_RETAIN_ALLOCATION_HANDLE = 24, /* cuMemRetainAllocationHandle */

	/* Context calls: which device each thread's allocations land on. */
	GPUMEM_OP_CTX_SET_CURRENT = 32,          /* cuCtxSetCurrent */
	GPUMEM_OP_CTX_PUSH_CURRENT,              /* cuCtxPushCurrent_v2 */
	GPUMEM_OP_CTX_POP_CURRENT,               /* cuCtxPopCurrent_v2 */
	GPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN,     /* cuDevicePrimaryCtxRetain */
	GPUMEM_OP_CTX_CREATE,                    /* cuCtxCreate_v2 */
	GPUMEM_OP_CTX_CREATE_V3,                 /* cuCtxCreate_v3 */
	GPUMEM_OP_CTX_CREATE_V4,                 /* cuCtxCreate_v4 */
	GPUMEM_OP_CTX_DESTROY,                   /* cuCtxDestroy_v2 */

	/* Module and library loads and unloads: with eager loading, a load puts
	 * its kernel images on the device (user space sizes them by NVML). */
	GPUMEM_OP_MODULE_LOAD = 48,              /* cuModuleLoad */
	GPUMEM_OP_MODULE_LOAD_DATA,              /* cuModuleLoadData */
	GPUMEM_OP_MODULE_LOAD_DATA_EX,           /* cuModuleLoadDataEx */
	GPUMEM_OP_MODULE_LOAD_FAT_BINARY,        /* cuModuleLoadFatBinary */
	GPUMEM_OP_LIBRARY_LOAD_DATA,             /* cuLibraryLoadData */
	GPUMEM_OP_LIBRARY_LOAD_FROM_FILE,        /* cuLibraryLoadFromFile */
	GPUMEM_OP_MODULE_UNLOAD,                 /* cuModuleUnload */
	GPUMEM_OP_LIBRARY_UNLOAD,                /* cuLibraryUnload */
};

/* CUDA_ERROR_OUT_OF_MEMORY: the result of PyTorch's allocator's own
 * out-of-memory (GPUMEM_OP_TENSOR_OOM). */
#define GPUMEM_CUDA_ERROR_OUT_OF_MEMORY 2

static __always_inline bool gpumem_op_is_free(__u16 op)
{
	return (op >= GPUMEM_OP_MEM_FREE && op <= GPUMEM_OP_MEM_RELEASE) || op == GPUMEM_OP_TENSOR_FREE;
}

static __always_inline bool gpumem_op_is_context(__u16 op)
{
	return op >= GPUMEM_OP_CTX_SET_CURRENT && op <= GPUMEM_OP_CTX_DESTROY;
}

static __always_inline bool gpumem_op_is_module(__u16 op)
{
	return op >= GPUMEM_OP_MODULE_LOAD && op <= GPUMEM_OP_LIBRARY_UNLOAD;
}

static __always_inline bool gpumem_op_unloads_module(__u16 op)
{
	return op == GPUMEM_OP_MODULE_UNLOAD || op == GPUMEM_OP_LIBRARY_UNLOAD;
}

/* The device of a call made with no context gpu-mem knows: made before it
 * attached, or in a context it did not see created. */
#define GPUMEM_DEVICE_UNKNOWN -1
/* cuMemCreate of host memory (a CU_MEM_LOCATION_TYPE_HOST* location). */
#define GPUMEM_DEVICE_HOST -2

/* Contexts a thread pushed, innermost last; cuCtxSetCurrent replaces the top. */
#define GPUMEM_MAX_CTX_STACK 8
struct gpumem_ctx_stack {
	__u64 ctx[GPUMEM_MAX_CTX_STACK];
	__u32 depth;
};

enum gpumem_event_type {
	GPUMEM_EVENT_CALL = 1, /* a driver call returned */
	GPUMEM_EVENT_EXIT = 2, /* the last thread of a traced process exited */
};

enum gpumem_loss {
	GPUMEM_LOSS_INFLIGHT_FULL = 0,  /* call not tracked: inflight map full */
	GPUMEM_LOSS_READ_RESULT,        /* allocation's out-parameter unreadable */
	GPUMEM_LOSS_PROCESSES_FULL,     /* process exit will not be reported */
	GPUMEM_LOSS_AGGREGATE_FULL,     /* allocation missing from IG's aggregate maps (stacks, processes, class_stats, class_live) */
	GPUMEM_LOSS_UNFINISHED,         /* stock IG: allocation not reported, finish_allocations empty */
	GPUMEM_LOSS_NESTED_TOO_DEEP,    /* call not tracked: deeper than GPUMEM_MAX_NESTED */
	GPUMEM_LOSS_SCRATCH_BUSY,       /* event dropped: the CPU's scratch event was in use */
	GPUMEM_LOSS_CONTEXTS_FULL,      /* context change not kept (thread_contexts or context_devices full), or a context beyond 16 of a process left at its exit */
	GPUMEM_LOSS_TENSOR_ARG,         /* tensor event dropped: a USDT argument unreadable */
	GPUMEM_LOSS_STACK_UNAVAILABLE,  /* stock IG: allocation aggregated without its stack (ig_ustack refused it) */
	GPUMEM_LOSS_ALLOCATOR_CALL,    /* a call of the allocator's own functions (checkpoint restore, raw_alloc) not followed whole: unreadable, too many blocks, or allocator_calls or pool_threads full */
	GPUMEM_LOSS_MAX,
};

/* event.stack_flags */
enum gpumem_stack_flag {
	GPUMEM_PY_TRUNCATED = 1,  /* deeper than GPUMEM_MAX_PY_FRAMES: outermost frames dropped */
	GPUMEM_PY_NO_THREAD = 2,  /* a Python process, but no thread state for this thread */
	GPUMEM_PY_READ_ERROR = 4, /* the frame chain could not be read to its end */
	GPUMEM_NATIVE_TRUNCATED = 8, /* deeper than GPUMEM_MAX_STACK_DEPTH: outermost frames dropped */
	/* made while the thread allocates to a private pool of PyTorch's
	 * allocator (a CUDA graph's capture or warm-up), or by a checkpoint
	 * restore (always of a graph's pool) */
	GPUMEM_GRAPH_POOL = 16,
	/* A tensor allocation whose Python frames are the ones its thread sent
	 * whole before: pystack holds one entry, whose code is their hash
	 * (python_stack_hash) and instr their count. gpumem names them again
	 * from the earlier event; only gpumem attaches the tensor probes. */
	GPUMEM_PY_SENT_BEFORE = 32,
};

/* gpumem_pyframe.flags */
enum gpumem_pyframe_flag {
	/* The frame is the first one a C-level call of the evaluation loop
	 * (one native _PyEval_EvalFrameDefault frame) runs. */
	GPUMEM_PYFRAME_ENTRY = 1,
};

#define GPUMEM_PY_NO_FIELD 0xffff

/* How to walk one process's interpreter, from user space (pystack/): the
 * address of _PyRuntime and the offsets, in bytes, of the fields followed.
 * A field a version lacks is GPUMEM_PY_NO_FIELD. */
struct gpumem_python {
	__u64 runtime;
	__u16 runtime_interpreters_head;
	__u16 interp_next;
	__u16 interp_threads_head;
	__u16 tstate_next;
	__u16 tstate_thread_id;     /* pthread_self(): the thread pointer (fs base) */
	__u16 tstate_frame;         /* the current frame, or the _PyCFrame holding it */
	__u16 cframe_current_frame; /* 3.11, 3.12 */
	__u16 frame_previous;
	__u16 frame_code;
	__u16 frame_instr;          /* 3.10: int f_lasti; later: instruction pointer */
	__u16 frame_owner;          /* 3.12+: char owner */
	__u16 frame_is_entry;       /* 3.11: bool is_entry */
	__u16 frame_localsplus;     /* 3.10: first local, for self or cls */
	__u16 type_flags;           /* 3.10: PyTypeObject.tp_flags */
	__u16 tstate_datastack_chunk; /* 3.11+: the _PyStackChunk holding the frames */
	__u8 instr_size;            /* bytes of frame_instr */
	__u8 owner_cstack;          /* owner value of C-stack shim frames; 0: none */
};

struct gpumem_pyframe {
	__u64 code;  /* PyCodeObject * */
	__u64 instr; /* f_lasti (3.10) or instruction pointer */
	__u64 cls;   /* 3.10: the class of the first argument (self or cls), else 0 */
	__u32 flags; /* enum gpumem_pyframe_flag */
	__u32 pad;
};

/* Arguments of a call between its entry and its return. */
struct gpumem_call {
	__u64 timestamp;
	__u64 target;    /* out-parameter address (allocations) or the pointer/handle freed */
	__u64 bytes;     /* requested bytes; the height for cuMemAllocPitch_v2; a context call's device */
	__u64 aux;       /* cuMemAllocPitch_v2's pPitch; cuMemCreate's CUmemAllocationProp */
	__u16 op;
};

/* Calls in flight on one thread: a traced driver function may call another
 * (the simulated driver's cuCtxCreate pushes with cuCtxPushCurrent_v2). */
#define GPUMEM_MAX_NESTED 4
struct gpumem_calls {
	struct gpumem_call calls[GPUMEM_MAX_NESTED];
	__u32 depth;
};

/* The event header uses IG's types (gadget/types.h) so that stock IG shows
 * and enriches it: the process, its mount namespace (Kubernetes metadata). */
struct gpumem_event {
	gadget_timestamp timestamp; /* ns since boot: return of an allocation, entry of a free */
	__u64 address;              /* pointer or VMM handle */
	__u64 bytes;                /* allocated bytes, or requested bytes of a failed call */
	struct gadget_process proc;
	__s32 result;    /* CUresult */
	__u16 type;      /* enum gpumem_event_type */
	__u16 op;        /* enum gpumem_op */
	__u32 ustack_len; /* native frames, sent right after the pystack_len Python frames */
	__u16 pystack_len;
	__u16 stack_flags; /* enum gpumem_stack_flag */
	__s32 device;     /* device ordinal, or GPUMEM_DEVICE_UNKNOWN */
	__u32 __pad;
	struct gpumem_pyframe pystack[GPUMEM_MAX_PY_FRAMES];
	/* Room for the native stack when all Python frames are used; with fewer,
	 * it starts right after the last one, so that events stay short. */
	__u64 ustack[GPUMEM_MAX_STACK_DEPTH];
};

/* A tensor free (pytorch:free, and the frees of PyTorch's own functions),
 * sent alone: no comm, no stacks. User space tells it from a gpumem_event by
 * its size, smaller than a gpumem_event's header. */
struct gpumem_tensor_free {
	__u64 timestamp; /* ns since boot, at the free's entry */
	__u64 address;
	__u32 pid;
	__u32 tid;
};

/* Where a USDT argument is at the probe (package usdt's Arg). */
enum gpumem_usdt_arg_kind {
	GPUMEM_USDT_REGISTER = 1, /* in the register at pt_regs offset reg */
	GPUMEM_USDT_MEMORY,       /* at the register's value plus value */
	GPUMEM_USDT_CONSTANT,     /* value itself */
};

struct gpumem_usdt_arg {
	__s64 value;
	__u16 reg;
	__u8 kind; /* enum gpumem_usdt_arg_kind */
	__u8 size; /* bytes */
	__u8 is_signed;
	__u8 __pad[3];
};

/* One USDT site of PyTorch's allocator (the attach cookie indexes them):
 * pytorch:malloc's pointer, device and size, or pytorch:free's pointer. */
#define GPUMEM_USDT_ARGS 3
#define GPUMEM_MAX_USDT_SITES 256
struct gpumem_usdt_site {
	struct gpumem_usdt_arg args[GPUMEM_USDT_ARGS];
	__u16 op; /* GPUMEM_OP_TENSOR_ALLOC or GPUMEM_OP_TENSOR_FREE */
};

/* PyTorch's checkpoint restore of a CUDA graph's private pool,
 * NativeCachingAllocator::setCheckpointPoolState(device, shared_ptr<AllocatorState>)
 * (docs/pytorch-allocator-books.md): the layouts read, libstdc++'s vectors
 * (begin, end) and torch's structs, unchanged since torch 2.1. */
#define GPUMEM_CKPT_DELTA_FREED 0       /* CheckpointDelta::ptrs_freed, a vector<void*> */
#define GPUMEM_CKPT_STATE_SEGMENTS 24   /* PrivatePoolState::segments (after the vtable and owner_id) */
#define GPUMEM_CKPT_SEGMENT_SIZE 32     /* sizeof(SegmentState): vector<BlockState> blocks, bool is_small */
#define GPUMEM_CKPT_BLOCK_SIZE 80       /* sizeof(BlockState) */
#define GPUMEM_CKPT_BLOCK_BYTES 48      /* BlockState::size */
#define GPUMEM_CKPT_BLOCK_PTR 56        /* BlockState::ptr */
#define GPUMEM_CKPT_BLOCK_ALLOCATED 64  /* BlockState::allocated */
/* The most pointers freed, segments and blocks per segment one restore
 * follows; past them it is counted (GPUMEM_LOSS_ALLOCATOR_CALL). */
#define GPUMEM_MAX_RESTORED 65536

/* Stock IG's view (with `aggregate`): bytes per process, native stack
 * (IG's stack map) and device, kept in BPF. */
/* Key fields IG shows in the value are named __*, which IG skips: a
 * top-level field named like one inside the value (proc.pid,
 * ustack_raw.stack_id) clashes in IG's data source. */
struct gpumem_stack_key {
	__u32 __pid;
	__u32 __stack_id; /* ig_ustack id; 0 without collect_ustack */
	__s32 device;
	__u32 __pad;    /* IG skips fields named __* */
};

struct gpumem_stack {
	struct gadget_process proc;
	struct gadget_user_stack ustack_raw;
	__u64 alloc_bytes;
	__u64 alloc_count;
	__u64 live_bytes;
	__u64 live_count;
	/* The process's previous stack (gpumem_stack_link), so that its exit
	 * drops its own stacks without walking the map. */
	__u64 __next;
};

/* A stack of a known process, as one word: its stack ID and device. */
#define GPUMEM_STACK_LINK(id, device) (((__u64)(id) << 32) | (__u32)(device))
#define GPUMEM_STACK_LINK_END (~0ULL) /* no stack ID is 0xffffffff */

/* What one live allocation charged, for its free. */
struct gpumem_allocation_key {
	__u32 pid;
	__u32 __pad;
	__u64 address;
};

struct gpumem_allocation {
	struct gpumem_stack_key stack;
	__u64 bytes;
	__u64 started; /* the process's start time: an entry of an exited one is stale */
	__u32 host_raw; /* enum gpumem_mem_class, for the free's counter */
	__u32 __pad;
};

/* Memory classes of Inspektor Gadget's top_cuda_memory, whose metrics IG's
 * GPU observability dashboard reads: on the GPU (device, VMM and managed
 * memory), or host memory the GPU maps (pinned, VMM placed on the host).
 * IG's eBPF operator shows a field host_raw of an enum as `host`, its
 * name: top_cuda_memory's names (DEVICE alone is a kernel enumerator). */
enum gpumem_mem_class : __u8 {
	CUDA_MEM_DEVICE = 0,
	CUDA_MEM_HOST = 1,
};

/* Bytes per process and class as top_cuda_memory counts them (stock IG,
 * with `aggregate`): deltas, as IG's map iterator deletes what it reads
 * every interval and its otel-metrics operator adds each reading to a
 * counter. */
struct gpumem_class_key {
	gadget_pid pid;
	enum gpumem_mem_class host_raw;
	__u8 __pad[3];
};

struct gpumem_class_stats {
	gadget_mntns_id mntns_id; /* IG adds the pod from it */
	gadget_comm comm[TASK_COMM_LEN];
	gadget_counter__u64 mem_alloc_bytes;
	gadget_counter__u64 mem_free_bytes;
	gadget_counter__u64 mem_implicit_free_bytes; /* held at the process's exit */
};

/* What a process holds in a class, not read by IG: released as implicit
 * frees at its exit, with the pod and name it allocated under. */
struct gpumem_class_live {
	__u64 bytes;
	gadget_mntns_id mntns_id;
	gadget_comm comm[TASK_COMM_LEN];
};

/* Per process totals, for IG's otel-metrics. IG's map iterators take
 * struct keys only. */
struct gpumem_process_key {
	__u32 __pid;
};

struct gpumem_process {
	struct gadget_process proc;
	__u64 live_bytes;
	__u64 alloc_bytes;
	__u64 alloc_count;
	__u64 free_count;
	__u64 failed_count;
	__u64 __started; /* start time of the process's main thread */
	__u64 __stacks;  /* its latest stack (gpumem_stack_link), GPUMEM_STACK_LINK_END for none */
};

#endif
