/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The records sent to user space (in BTF for the generated Go bindings) and
 * how: the ring buffer, the per-CPU scratch event one program holds at a
 * time, and the loss counters. */
#ifndef GPUMEM_OUTPUT_H
#define GPUMEM_OUTPUT_H

#include "../gpumem.h"

/* One counter per kind of loss (enum gpumem_loss), summed by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GPUMEM_LOSS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} losses SEC(".maps");

/* Bytes of the driver's allocations whose events the ring buffer could not
 * take: never charged to a stack, but counted (an agent too slow, or
 * stopped long with its state kept). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} events_lost_bytes SEC(".maps");

/* Set by the reader once the ring buffer stayed empty a while, to be woken
 * by the next event rather than look again; cleared by the event that wakes
 * it. Stock IG's reader never sets it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} reader_asleep SEC(".maps");

/* An event with its stack is too large for the BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gpumem_event);
} scratch SEC(".maps");

/* How many programs on this CPU want the scratch event (and the other
 * per-CPU scratch values used with it). Programs here run with migration
 * disabled but, on a kernel with full preemption, not with preemption
 * disabled: a task preempted while it builds its event would have it
 * overwritten by the next task's probe. hold_scratch lets one have it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} scratch_users SEC(".maps");

/* Put the enums and the records user space needs into BTF for the generated
 * Go bindings, the way IG's GADGET_TRACER anchors its event type. */
const enum gpumem_event_type *gpumem_event_type_btf __attribute__((unused));
const enum gpumem_loss *gpumem_loss_btf __attribute__((unused));
const enum gpumem_op *gpumem_op_btf __attribute__((unused));
const enum gpumem_stack_flag *gpumem_stack_flag_btf __attribute__((unused));
const enum gpumem_pyframe_flag *gpumem_pyframe_flag_btf __attribute__((unused));
const enum gpumem_usdt_arg_kind *gpumem_usdt_arg_kind_btf __attribute__((unused));
const struct gpumem_tensor_free *gpumem_tensor_free_btf __attribute__((unused));

GADGET_TRACER_MAP(events, GPUMEM_RINGBUF_BYTES);
GADGET_TRACER(cuda, events, gpumem_event);

/* Atomic although per CPU: a program preempted between the load and the
 * store (see scratch_users) would lose the count of the one that ran
 * meanwhile. */
static __always_inline void count_loss(__u32 loss)
{
	__u64 *n = bpf_map_lookup_elem(&losses, &loss);
	if (n)
		__sync_fetch_and_add(n, 1);
}

/* hold_scratch returns this CPU's scratch event if no other program holds
 * it; NULL, counted, if one does. The count goes up before it is read, so
 * that of two programs racing for it at most one sees itself alone. The
 * holder gives it back with release_scratch. */
static __always_inline struct gpumem_event *hold_scratch(void)
{
	__u32 zero = 0;
	__u64 *users = bpf_map_lookup_elem(&scratch_users, &zero);
	struct gpumem_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!users || !e)
		return NULL;
	__sync_fetch_and_add(users, 1);
	if (*(volatile __u64 *)users == 1)
		return e;
	__sync_fetch_and_sub(users, 1);
	count_loss(GPUMEM_LOSS_SCRATCH_BUSY);
	return NULL;
}

static __always_inline void release_scratch(void)
{
	__u32 zero = 0;
	__u64 *users = bpf_map_lookup_elem(&scratch_users, &zero);
	if (users)
		__sync_fetch_and_sub(users, 1);
}

static __always_inline void count_lost_event(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&events_lost_samples, &zero);
	if (n)
		__sync_fetch_and_add(n, 1); /* atomic, as count_loss */
}

/* wakeup_flags wake the reader, which polls while events come, only when
 * the ring buffer is filling, or when it sleeps: a wakeup per event would
 * cost more than the rest of the probe. Two events that find it asleep at
 * once both wake it, which is harmless. */
static __always_inline __u64 wakeup_flags(void)
{
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > GPUMEM_RINGBUF_BYTES / 4)
		return BPF_RB_FORCE_WAKEUP;
	__u32 zero = 0;
	__u32 *asleep = bpf_map_lookup_elem(&reader_asleep, &zero);
	if (!asleep || !*asleep)
		return BPF_RB_NO_WAKEUP;
	*asleep = 0;
	return BPF_RB_FORCE_WAKEUP;
}

/* count_lost_bytes counts the bytes of a dropped event that is a driver
 * allocation (not a context, a module or a tensor; a free has none). */
static __always_inline void count_lost_bytes(const struct gpumem_event *e)
{
	if (e->result || !e->op || e->op >= GPUMEM_OP_TENSOR_ALLOC)
		return;
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&events_lost_bytes, &zero);
	if (n)
		__sync_fetch_and_add(n, e->bytes);
}

/* output sends an event built in the scratch; false when it is dropped,
 * counted in events_lost_samples, as IG's helpers do, its bytes in
 * events_lost_bytes. */
static __always_inline bool output(struct gpumem_event *e, __u64 size)
{
	if (!bpf_ringbuf_output(&events, e, size, wakeup_flags()))
		return true;
	count_lost_event();
	count_lost_bytes(e);
	return false;
}

/* reserve_header reserves an event without stacks (a free, a retain, an
 * exit) in the ring buffer itself, where no other program can overwrite it;
 * send it with submit. */
static __always_inline struct gpumem_event *reserve_header(void)
{
	struct gpumem_event *e = bpf_ringbuf_reserve(&events, offsetof(struct gpumem_event, pystack), 0);
	if (!e)
		count_lost_event();
	return e;
}

static __always_inline void submit(void *e)
{
	bpf_ringbuf_submit(e, wakeup_flags());
}

#endif
