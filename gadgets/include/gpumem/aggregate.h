/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Stock IG's in-kernel totals: live and allocated bytes per native stack
 * and per process, and the counters of IG's top_cuda_memory, kept only
 * with aggregate set, where no user-space ledger runs. */
#ifndef GPUMEM_AGGREGATE_H
#define GPUMEM_AGGREGATE_H

#include "output.h"

/* With aggregate set (stock IG, where no user-space ledger runs), the
 * probes also keep bytes per stack and per process in these maps, which IG
 * reads as data sources (GADGET_MAPITER). gpumem leaves it off. */
const volatile bool aggregate = false;
GADGET_PARAM(aggregate);

#define GPUMEM_MAX_STACKS 16384
#define GPUMEM_MAX_ALLOCATIONS 131072

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_STACKS);
	__type(key, struct gpumem_stack_key);
	__type(value, struct gpumem_stack);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_ALLOCATIONS);
	__type(key, struct gpumem_allocation_key);
	__type(value, struct gpumem_allocation);
} allocations SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, struct gpumem_process_key);
	__type(value, struct gpumem_process);
} processes SEC(".maps");

/* Two views of one map: IG's otel-profiles takes one value per data source. */
GADGET_MAPITER(allocated, stacks);
GADGET_MAPITER(live, stacks);
GADGET_MAPITER(processes, processes);

/* The counters of Inspektor Gadget's top_cuda_memory (mem_alloc_bytes_total,
 * ... in Prometheus), per process and memory class: deltas since IG's
 * iterator last read and deleted them. class_live, not read by IG, holds
 * what each process holds per class until its exit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, struct gpumem_class_key);
	__type(value, struct gpumem_class_stats);
} class_stats SEC(".maps");

GADGET_MAPITER(libcuda_mem_stats, class_stats);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, struct gpumem_class_key);
	__type(value, struct gpumem_class_live);
} class_live SEC(".maps");

/* mem_class is the class of an allocation: host memory for the pinned
 * allocations and for VMM memory placed on the host. */
static __always_inline __u32 mem_class(const struct gpumem_event *e)
{
	bool host = e->op == GPUMEM_OP_MEM_ALLOC_HOST || e->op == GPUMEM_OP_MEM_HOST_ALLOC ||
		    e->device == GPUMEM_DEVICE_HOST;
	return host ? CUDA_MEM_HOST : CUDA_MEM_DEVICE;
}

/* lookup_or_init returns map's value for key, made from init if missing;
 * NULL, counted, when the map is full. */
static __always_inline void *lookup_or_init(void *map, const void *key, const void *init)
{
	void *v = bpf_map_lookup_elem(map, key);
	if (v)
		return v;
	bpf_map_update_elem(map, key, init, BPF_NOEXIST); /* or made meanwhile */
	v = bpf_map_lookup_elem(map, key);
	if (!v)
		count_loss(GPUMEM_LOSS_AGGREGATE_FULL);
	return v;
}

static __always_inline struct gpumem_class_stats *class_stats_of(__u32 pid, __u32 host_raw, __u64 mntns_id,
								 const char *comm)
{
	struct gpumem_class_key k = {.pid = pid, .host_raw = host_raw};
	struct gpumem_class_stats init = {.mntns_id = mntns_id};
	__builtin_memcpy(init.comm, comm, sizeof(init.comm));
	return lookup_or_init(&class_stats, &k, &init);
}

/* count_class_alloc adds an allocation to its class's counter and to what
 * the process holds in it. Not inlined, and neither is count_class_free: a
 * frame of their own keeps the allocations' return programs' frame, whose
 * tail call the verifier allows only under 256 bytes, as it was. */
static __noinline void count_class_alloc(const struct gpumem_event *e, __u32 host_raw)
{
	struct gpumem_class_stats *s = class_stats_of(e->proc.pid, host_raw, e->proc.mntns_id, e->proc.comm);
	if (s)
		__sync_fetch_and_add(&s->mem_alloc_bytes, e->bytes);
	struct gpumem_class_key k = {.pid = e->proc.pid, .host_raw = host_raw};
	struct gpumem_class_live init = {.mntns_id = e->proc.mntns_id};
	__builtin_memcpy(init.comm, e->proc.comm, sizeof(init.comm));
	struct gpumem_class_live *l = lookup_or_init(&class_live, &k, &init);
	if (l)
		__sync_fetch_and_add(&l->bytes, e->bytes);
}

static __noinline void count_class_free(const struct gpumem_event *e, const struct gpumem_allocation *a)
{
	struct gpumem_class_stats *s = class_stats_of(e->proc.pid, a->host_raw, e->proc.mntns_id, e->proc.comm);
	if (s)
		__sync_fetch_and_add(&s->mem_free_bytes, a->bytes);
	struct gpumem_class_key k = {.pid = e->proc.pid, .host_raw = a->host_raw};
	struct gpumem_class_live *l = bpf_map_lookup_elem(&class_live, &k);
	if (l)
		__sync_fetch_and_sub(&l->bytes, a->bytes);
}

/* release_class counts what an exited process held in one class as freed
 * implicitly. */
static __always_inline void release_class(__u32 pid, __u32 host_raw)
{
	struct gpumem_class_key k = {.pid = pid, .host_raw = host_raw};
	struct gpumem_class_live *l = bpf_map_lookup_elem(&class_live, &k);
	if (!l)
		return;
	struct gpumem_class_stats *s = class_stats_of(pid, host_raw, l->mntns_id, l->comm);
	if (s)
		__sync_fetch_and_add(&s->mem_implicit_free_bytes, l->bytes);
	bpf_map_delete_elem(&class_live, &k);
}

/* A new map value is built here: gpumem_stack is too large for the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gpumem_stack);
} stack_scratch SEC(".maps");

/* process_started is the calling process's start time, which tells a
 * process from an earlier one with the same pid. */
static __always_inline __u64 process_started(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	return BPF_CORE_READ(task, group_leader, start_time);
}

static __always_inline struct gpumem_process *process_totals(const struct gpumem_event *e)
{
	struct gpumem_process_key key = {.__pid = e->proc.pid};
	struct gpumem_process *p = bpf_map_lookup_elem(&processes, &key);
	if (p)
		return p;
	struct gpumem_process init = {
		.proc = e->proc,
		.__started = process_started(),
		.__stacks = GPUMEM_STACK_LINK_END,
	};
	if (bpf_map_update_elem(&processes, &key, &init, BPF_NOEXIST) && !bpf_map_lookup_elem(&processes, &key))
		count_loss(GPUMEM_LOSS_AGGREGATE_FULL);
	return bpf_map_lookup_elem(&processes, &key);
}

/* link_stack puts a stack just made at the head of its process's list,
 * which two threads of the process may extend at once. */
static __always_inline void link_stack(struct gpumem_process *p, struct gpumem_stack *s,
				       const struct gpumem_stack_key *k)
{
	__u64 link = GPUMEM_STACK_LINK(k->__stack_id, k->device);
	for (int i = 0; i < 64; i++) {
		__u64 head = *(volatile __u64 *)&p->__stacks;
		s->__next = head;
		if (__sync_val_compare_and_swap(&p->__stacks, head, link) == head)
			return;
	}
	count_loss(GPUMEM_LOSS_AGGREGATE_FULL); /* the stack outlives its process */
}

/* stack_of returns the process's stack for this allocation, made and
 * linked on first use. A stack ig_ustack refused (a bucket taken by
 * another stack: IG's helper does not replace it) is counted, and its
 * bytes charged to stack ID 0, as without collect_ustack. */
static __always_inline struct gpumem_stack *stack_of(struct pt_regs *ctx, const struct gpumem_event *e,
						     struct gpumem_process *p, struct gpumem_stack_key *key)
{
	__u32 zero = 0;
	struct gpumem_stack *init = bpf_map_lookup_elem(&stack_scratch, &zero);
	if (!init)
		return NULL;
	gadget_get_user_stack(ctx, &init->ustack_raw);
	if ((__s32)init->ustack_raw.stack_id < 0) {
		count_loss(GPUMEM_LOSS_STACK_UNAVAILABLE);
		init->ustack_raw.stack_id = 0;
	}
	*key = (struct gpumem_stack_key){.__pid = e->proc.pid, .__stack_id = init->ustack_raw.stack_id, .device = e->device};
	struct gpumem_stack *s = bpf_map_lookup_elem(&stacks, key);
	if (s)
		return s;
	init->proc = e->proc;
	init->alloc_bytes = init->alloc_count = init->live_bytes = init->live_count = 0;
	if (bpf_map_update_elem(&stacks, key, init, BPF_NOEXIST) == 0) {
		s = bpf_map_lookup_elem(&stacks, key);
		if (s)
			link_stack(p, s, key);
		return s;
	}
	return bpf_map_lookup_elem(&stacks, key); /* made by another thread meanwhile, or the map is full */
}

/* drop_stale deletes an allocation of a process that exited: the exit
 * leaves them, so that it does not walk the map. */
static long drop_stale(struct bpf_map *map, struct gpumem_allocation_key *k, struct gpumem_allocation *a, void *unused)
{
	struct gpumem_process_key key = {.__pid = k->pid};
	struct gpumem_process *p = bpf_map_lookup_elem(&processes, &key);
	if (!p || p->__started != a->started)
		bpf_map_delete_elem(map, k);
	return 0;
}

/* remember_allocation keeps what a free will release. A full map is swept
 * of exited processes' allocations once, then tried again: the sweep runs
 * once per map's worth of them, not at every exit. */
static __always_inline bool remember_allocation(const struct gpumem_allocation_key *k, const struct gpumem_allocation *a)
{
	if (bpf_map_update_elem(&allocations, k, a, BPF_ANY) == 0)
		return true;
	bpf_for_each_map_elem(&allocations, drop_stale, NULL, 0);
	return bpf_map_update_elem(&allocations, k, a, BPF_ANY) == 0;
}

/* charge adds a successful allocation to its stack, its process, and the
 * allocations a free will look up. */
static __always_inline void charge(struct pt_regs *ctx, const struct gpumem_event *e)
{
	struct gpumem_process *p = process_totals(e);
	if (!p)
		return;
	struct gpumem_allocation a = {.bytes = e->bytes, .started = p->__started, .host_raw = mem_class(e)};
	struct gpumem_stack *s = stack_of(ctx, e, p, &a.stack);
	struct gpumem_allocation_key k = {.pid = e->proc.pid, .address = e->address};
	if (!s || !remember_allocation(&k, &a)) {
		count_loss(GPUMEM_LOSS_AGGREGATE_FULL);
		return;
	}
	count_class_alloc(e, a.host_raw);
	__sync_fetch_and_add(&s->alloc_bytes, e->bytes);
	__sync_fetch_and_add(&s->alloc_count, 1);
	__sync_fetch_and_add(&s->live_bytes, e->bytes);
	__sync_fetch_and_add(&s->live_count, 1);
	__sync_fetch_and_add(&p->alloc_bytes, e->bytes);
	__sync_fetch_and_add(&p->alloc_count, 1);
	__sync_fetch_and_add(&p->live_bytes, e->bytes);
}

/* release takes a freed allocation off its stack and process. */
static __always_inline void release(const struct gpumem_event *e)
{
	struct gpumem_allocation_key k = {.pid = e->proc.pid, .address = e->address};
	struct gpumem_allocation *a = bpf_map_lookup_elem(&allocations, &k);
	if (!a)
		return; /* allocated before the gadget started, or a refused free */
	if (a->started == process_started())
		count_class_free(e, a);
	struct gpumem_process_key key = {.__pid = e->proc.pid};
	struct gpumem_process *p = bpf_map_lookup_elem(&processes, &key);
	if (p && p->__started == a->started) {
		struct gpumem_stack *s = bpf_map_lookup_elem(&stacks, &a->stack);
		if (s) {
			__sync_fetch_and_sub(&s->live_bytes, a->bytes);
			__sync_fetch_and_sub(&s->live_count, 1);
		}
		__sync_fetch_and_sub(&p->live_bytes, a->bytes);
		__sync_fetch_and_add(&p->free_count, 1);
	}
	bpf_map_delete_elem(&allocations, &k); /* or an exited process's, with this pid */
}

static __always_inline void aggregate_allocation(struct pt_regs *ctx, const struct gpumem_event *e)
{
	if (e->result == 0) {
		charge(ctx, e);
		return;
	}
	struct gpumem_process *p = process_totals(e);
	if (p)
		__sync_fetch_and_add(&p->failed_count, 1);
}

struct forget_stacks {
	__u32 pid;
	__u64 link;
};

static long forget_stack_step(__u64 index, struct forget_stacks *c)
{
	if (c->link == GPUMEM_STACK_LINK_END)
		return 1;
	struct gpumem_stack_key k = {.__pid = c->pid, .__stack_id = c->link >> 32, .device = (__s32)c->link};
	struct gpumem_stack *s = bpf_map_lookup_elem(&stacks, &k);
	if (!s)
		return 1;
	c->link = s->__next;
	bpf_map_delete_elem(&stacks, &k);
	return 0;
}

/* forget_process drops an exited process and its stacks from the
 * aggregate maps, following its list of stacks: the driver released all it
 * held. Its allocations are left to drop_stale. */
static __always_inline void forget_process(__u32 pid)
{
	struct gpumem_process_key key = {.__pid = pid};
	struct gpumem_process *p = bpf_map_lookup_elem(&processes, &key);
	if (!p)
		return;
	struct forget_stacks c = {.pid = pid, .link = p->__stacks};
	bpf_loop(GPUMEM_MAX_STACKS, forget_stack_step, &c, 0);
	bpf_map_delete_elem(&processes, &key);
}

#endif
