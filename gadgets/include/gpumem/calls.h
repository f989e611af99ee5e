/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The driver calls in flight, per thread: their arguments kept at entry
 * for their return. */
#ifndef GPUMEM_CALLS_H
#define GPUMEM_CALLS_H

#include "output.h"

/* Calls in flight, a stack per thread (keyed by pid_tgid): a traced driver
 * function may call another. A thread's entry stays until it exits; the exit
 * hook below removes it, with any call the thread never returned from. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct gpumem_calls);
} inflight SEC(".maps");

static __always_inline int enter(__u16 op, __u64 target, __u64 bytes, __u64 aux)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct gpumem_calls *calls = bpf_map_lookup_elem(&inflight, &id);
	if (!calls) {
		static const struct gpumem_calls none;
		if (bpf_map_update_elem(&inflight, &id, &none, BPF_NOEXIST) && bpf_map_lookup_elem(&inflight, &id) == NULL) {
			count_loss(GPUMEM_LOSS_INFLIGHT_FULL);
			return 0;
		}
		calls = bpf_map_lookup_elem(&inflight, &id);
		if (!calls)
			return 0;
	}
	/* Deeper calls are counted, not kept, so that returns still pair up. */
	__u32 depth = calls->depth++;
	if (depth >= GPUMEM_MAX_NESTED) {
		count_loss(GPUMEM_LOSS_NESTED_TOO_DEEP);
		return 0;
	}
	calls->calls[depth & (GPUMEM_MAX_NESTED - 1)] = (struct gpumem_call){
		.timestamp = bpf_ktime_get_ns(),
		.target = target,
		.bytes = bytes,
		.aux = aux,
		.op = op,
	};
	return 0;
}

/* finish_allocation fills address and bytes from the driver's out-parameters;
 * false when they cannot be read, which is counted. */
static __always_inline bool finish_allocation(struct gpumem_event *e, const struct gpumem_call *call)
{
	if (bpf_probe_read_user(&e->address, sizeof(e->address), (void *)call->target)) {
		count_loss(GPUMEM_LOSS_READ_RESULT);
		return false;
	}
	e->bytes = call->bytes;
	if (call->op == GPUMEM_OP_MEM_ALLOC_PITCH) {
		__u64 pitch;
		if (bpf_probe_read_user(&pitch, sizeof(pitch), (void *)call->aux)) {
			count_loss(GPUMEM_LOSS_READ_RESULT);
			return false;
		}
		e->bytes = pitch * call->bytes; /* bytes holds the height */
	}
	return true;
}

/* pop_call takes the calling thread's innermost call in flight; NULL when
 * there is none: filtered out, attached while the call ran, or too deep
 * (counted at entry). */
static __always_inline struct gpumem_call *pop_call(__u64 id)
{
	struct gpumem_calls *calls = bpf_map_lookup_elem(&inflight, &id);
	if (!calls || calls->depth == 0)
		return NULL;
	__u32 depth = --calls->depth;
	if (depth >= GPUMEM_MAX_NESTED)
		return NULL;
	return &calls->calls[depth & (GPUMEM_MAX_NESTED - 1)];
}

#endif
