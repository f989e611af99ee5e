/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Types shared by program.bpf.c and the Go loader (tracer/), which reads the
 * generated bindings of these structs. Keep the op numbers in step with
 * tracer/op.go. */
#ifndef GPUMEM_H
#define GPUMEM_H

/* 127 frames: the most bpf_get_stack returns with the default
 * kernel.perf_event_max_stack. */
#define GPUMEM_MAX_STACK_DEPTH 127
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
};

static __always_inline bool gpumem_op_is_free(__u16 op)
{
	return op >= GPUMEM_OP_MEM_FREE;
}

enum gpumem_event_type {
	GPUMEM_EVENT_CALL = 1, /* a driver call returned */
	GPUMEM_EVENT_EXIT = 2, /* the last thread of a traced process exited */
};

enum gpumem_loss {
	GPUMEM_LOSS_INFLIGHT_FULL = 0,      /* call not tracked: inflight map full */
	GPUMEM_LOSS_STACK,              /* event sent without its user stack */
	GPUMEM_LOSS_READ_RESULT,        /* allocation's out-parameter unreadable */
	GPUMEM_LOSS_PROCESSES_FULL,     /* process exit will not be reported */
	GPUMEM_LOSS_MAX,
};

/* Arguments of a call between its entry and its return. */
struct gpumem_call {
	__u64 timestamp;
	__u64 target;    /* out-parameter address (allocations) or the pointer/handle freed */
	__u64 bytes;     /* requested bytes; the height for cuMemAllocPitch_v2 */
	__u64 pitch_out; /* cuMemAllocPitch_v2's pPitch */
	__u16 op;
};

struct gpumem_event {
	__u64 timestamp; /* ns since boot: return of an allocation, entry of a free */
	__u64 address;   /* pointer or VMM handle */
	__u64 bytes;     /* allocated bytes, or requested bytes of a failed call */
	__u32 pid;
	__u32 tid;
	__s32 result;    /* CUresult */
	__u16 type;      /* enum gpumem_event_type */
	__u16 op;        /* enum gpumem_op */
	__u32 ustack_len; /* frames used in ustack */
	char comm[16];
	__u64 ustack[GPUMEM_MAX_STACK_DEPTH];
};

#endif
