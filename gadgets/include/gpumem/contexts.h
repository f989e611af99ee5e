/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* CUDA contexts: each thread's current one and each one's device, and the
 * contexts made, reported for the reconciliation with NVML. */
#ifndef GPUMEM_CONTEXTS_H
#define GPUMEM_CONTEXTS_H

#include "read.h"
#include "event.h"
#include "output.h"

/* Each thread's stack of current contexts, and each context's device. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_INFLIGHT);
	__type(key, __u32);
	__type(value, struct gpumem_ctx_stack);
} thread_contexts SEC(".maps");

/* A context pointer is a process's own: keyed by process, and dropped
 * with it (a primary context is never destroyed, only left behind). */
struct gpumem_context_key {
	__u32 pid;
	__u32 __pad;
	__u64 ctx;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, struct gpumem_context_key);
	__type(value, __s32);
} context_devices SEC(".maps");

/* Each process's contexts in context_devices, so that its exit drops them
 * one by one rather than walking the map. */
#define GPUMEM_MAX_PROCESS_CONTEXTS 16
struct gpumem_process_contexts {
	__u64 ctx[GPUMEM_MAX_PROCESS_CONTEXTS];
	__u64 n;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct gpumem_process_contexts);
} process_contexts SEC(".maps");

/* CUmemAllocationProp.location: {CUmemLocationType type; int id;} after two
 * enums; type 1 is CU_MEM_LOCATION_TYPE_DEVICE, 2 to 4 the host's (HOST,
 * HOST_NUMA, HOST_NUMA_CURRENT). */
#define GPUMEM_PROP_LOCATION_TYPE 8
#define GPUMEM_PROP_LOCATION_ID 12

/* current_device is the device of the calling thread's current context;
 * for cuMemCreate, the device its properties name, or the host. */
static __always_inline __s32 current_device(const struct gpumem_call *call, __u32 tid)
{
	if (call->op == GPUMEM_OP_MEM_CREATE) {
		__s32 loc[2] = {};
		if (bpf_probe_read_user(loc, sizeof(loc), (void *)(call->aux + GPUMEM_PROP_LOCATION_TYPE)))
			return GPUMEM_DEVICE_UNKNOWN;
		if (loc[0] == 1)
			return loc[1];
		return loc[0] >= 2 && loc[0] <= 4 ? GPUMEM_DEVICE_HOST : GPUMEM_DEVICE_UNKNOWN;
	}
	struct gpumem_ctx_stack *s = bpf_map_lookup_elem(&thread_contexts, &tid);
	if (!s || s->depth == 0)
		return GPUMEM_DEVICE_UNKNOWN;
	struct gpumem_context_key key = {
		.pid = bpf_get_current_pid_tgid() >> 32,
		.ctx = s->ctx[(s->depth - 1) & (GPUMEM_MAX_CTX_STACK - 1)],
	};
	__s32 *dev = bpf_map_lookup_elem(&context_devices, &key);
	return dev ? *dev : GPUMEM_DEVICE_UNKNOWN;
}

/* remember_context keeps a context's device, and lists a new one under its
 * process for the exit. */
static __always_inline void remember_context(const struct gpumem_context_key *key, __s32 dev)
{
	if (bpf_map_update_elem(&context_devices, key, &dev, BPF_NOEXIST) != 0) {
		if (bpf_map_update_elem(&context_devices, key, &dev, BPF_EXIST))
			count_loss(GPUMEM_LOSS_CONTEXTS_FULL);
		return; /* known: listed already */
	}
	struct gpumem_process_contexts none = {};
	struct gpumem_process_contexts *pc = bpf_map_lookup_elem(&process_contexts, &key->pid);
	if (!pc) {
		bpf_map_update_elem(&process_contexts, &key->pid, &none, BPF_NOEXIST);
		pc = bpf_map_lookup_elem(&process_contexts, &key->pid);
	}
	/* A slot taken by compare-and-swap: two threads may make contexts. */
	for (int tries = 0; pc && tries < 8; tries++) {
		__u64 i = *(volatile __u64 *)&pc->n;
		if (i >= GPUMEM_MAX_PROCESS_CONTEXTS)
			break;
		if (__sync_val_compare_and_swap(&pc->n, i, i + 1) == i) {
			pc->ctx[i & (GPUMEM_MAX_PROCESS_CONTEXTS - 1)] = key->ctx;
			return;
		}
	}
	count_loss(GPUMEM_LOSS_CONTEXTS_FULL); /* kept, but outlives its process */
}

/* forget_contexts drops an exited process's contexts. */
static __always_inline void forget_contexts(__u32 pid)
{
	struct gpumem_process_contexts *pc = bpf_map_lookup_elem(&process_contexts, &pid);
	if (!pc)
		return;
	struct gpumem_context_key key = {.pid = pid};
	for (int i = 0; i < GPUMEM_MAX_PROCESS_CONTEXTS; i++) {
		if (i >= pc->n)
			break;
		key.ctx = pc->ctx[i];
		bpf_map_delete_elem(&context_devices, &key);
	}
	bpf_map_delete_elem(&process_contexts, &pid);
}

/* track_context applies a successful context call. */
static __always_inline void track_context(const struct gpumem_call *call, __u32 tid)
{
	__u16 op = call->op;
	__u64 ctx = call->target;
	struct gpumem_context_key key = {.pid = bpf_get_current_pid_tgid() >> 32};

	if (op == GPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN || op == GPUMEM_OP_CTX_CREATE ||
	    op == GPUMEM_OP_CTX_CREATE_V3 || op == GPUMEM_OP_CTX_CREATE_V4) {
		ctx = read_ptr(call->target); /* the out-parameter */
		__s32 dev = (__s32)call->bytes;
		key.ctx = ctx;
		if (ctx)
			remember_context(&key, dev);
		if (op == GPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN)
			return;
		/* cuCtxCreate makes the context current, as a push, unless a
		 * cuCtxPushCurrent_v2 it made inside was seen doing so. */
		op = GPUMEM_OP_CTX_PUSH_CURRENT;
	}
	if (op == GPUMEM_OP_CTX_DESTROY) {
		key.ctx = ctx;
		bpf_map_delete_elem(&context_devices, &key); /* left in its process's list: a miss at exit */
		return;
	}
	struct gpumem_ctx_stack empty = {};
	struct gpumem_ctx_stack *s = bpf_map_lookup_elem(&thread_contexts, &tid);
	if (!s) {
		bpf_map_update_elem(&thread_contexts, &tid, &empty, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&thread_contexts, &tid);
		if (!s) {
			count_loss(GPUMEM_LOSS_CONTEXTS_FULL);
			return;
		}
	}
	switch (op) {
	case GPUMEM_OP_CTX_SET_CURRENT:
		if (s->depth == 0)
			s->depth = 1;
		s->ctx[(s->depth - 1) & (GPUMEM_MAX_CTX_STACK - 1)] = ctx;
		if (!ctx)
			s->depth = 0; /* cuCtxSetCurrent(NULL) unbinds */
		break;
	case GPUMEM_OP_CTX_PUSH_CURRENT:
		if (call->op != GPUMEM_OP_CTX_PUSH_CURRENT && s->depth > 0 &&
		    s->ctx[(s->depth - 1) & (GPUMEM_MAX_CTX_STACK - 1)] == ctx)
			break;
		if (s->depth < GPUMEM_MAX_CTX_STACK)
			s->depth++;
		s->ctx[(s->depth - 1) & (GPUMEM_MAX_CTX_STACK - 1)] = ctx;
		break;
	case GPUMEM_OP_CTX_POP_CURRENT:
		if (s->depth > 0)
			s->depth--;
		break;
	}
}

/* leave_context applies a context call that succeeded. */
static __always_inline int leave_context(struct pt_regs *ctx, const struct gpumem_call *call, __u64 id)
{
	if (PT_REGS_RC(ctx) == 0)
		track_context(call, (__u32)id);
	return 0;
}

/* CUDA contexts made and destroyed, for the reconciliation with NVML
 * (profiler/gpumemory.go): a context's device memory is NVML's growth across
 * its creation, charged to the stack that made it. Reported by gpumem's own
 * attach only; stock IG's per-function programs follow contexts as before. */

/* context_made is the context a successful creation returned, when the
 * process had not made it before (a primary context is retained again and
 * again); 0 otherwise. Read before track_context remembers it. */
static __always_inline __u64 context_made(const struct gpumem_call *call)
{
	if (call->op != GPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN && call->op != GPUMEM_OP_CTX_CREATE &&
	    call->op != GPUMEM_OP_CTX_CREATE_V3 && call->op != GPUMEM_OP_CTX_CREATE_V4)
		return 0;
	struct gpumem_context_key key = {.pid = bpf_get_current_pid_tgid() >> 32, .ctx = read_ptr(call->target)};
	if (!key.ctx || bpf_map_lookup_elem(&context_devices, &key))
		return 0;
	return key.ctx;
}

/* begin_context begins the event of a context made or a module loaded:
 * its handle, its device (a context's argument; a module's, the calling
 * thread's current context's); report_allocation adds the stacks that made
 * it. */
static __always_inline void begin_context(struct gpumem_event *e, const struct gpumem_call *call, __u64 context)
{
	begin_event(e, call->op, 0, false);
	e->timestamp = bpf_ktime_get_ns();
	e->address = context;
	/* When the call began: NVML read before it is what the call grew the
	 * process's number from (a read during it saw part of the growth). */
	e->bytes = call->timestamp;
	if (gpumem_op_is_module(call->op))
		e->device = current_device(call, e->proc.tid);
	else
		e->device = (__s32)call->bytes; /* the device argument */
}

#endif
