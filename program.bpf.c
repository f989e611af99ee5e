// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* gpu-mem: charge every GPU allocation made through the CUDA driver library
 * (libcuda.so.1) to the user call stack that made it.
 *
 * Entry probes remember each call's arguments per thread; return probes read
 * the driver's result and out-parameters and send one event per call through
 * the ring buffer. Frees are sent at their entry and have no return probe.
 * User space keeps the ledger (pointer -> bytes, stack), so a free releases
 * exactly what its allocation charged. Every event that
 * cannot be delivered whole is counted: in `losses`, and events dropped by a
 * full ring buffer in `events_lost_samples` (IG's convention).
 *
 * The same object runs under stock Inspektor Gadget: there, IG attaches the
 * per-function uprobes at the end of this file (IG cannot attach uprobe.multi
 * sections; gadget.yaml disables those), fills the process and mount
 * namespace of each event, filters by mount namespace, and, with `aggregate`
 * set, reads live and allocated bytes per native stack, and the counters of
 * IG's top_cuda_memory per process, from BPF maps, since it has no
 * user-space ledger. gpumem itself attaches the uprobe.multi
 * programs and keeps its ledger in user space.
 */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include <gadget/buffer.h>
#include <gadget/common.h>
#include <gadget/filter.h>
#include <gadget/macros.h>
#include <gadget/types.h>
#include <gadget/user_stack_map.h>

#include "gadgets/include/gpumem.h"

/* Calls in flight, a stack per thread (keyed by pid_tgid): a traced driver
 * function may call another. A thread's entry stays until it exits; the exit
 * hook below removes it, with any call the thread never returned from. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct gpumem_calls);
} inflight SEC(".maps");

/* Processes that allocated through the driver: only their exit is reported. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u8);
} traced_pids SEC(".maps");

/* With filter_pids set, only these processes are traced (gpumem --pid). */
const volatile bool filter_pids = false;
GADGET_PARAM(filter_pids);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u8);
} target_pids SEC(".maps");

/* filtered_out says whether --pid's filter leaves process pid out. */
static __always_inline bool filtered_out(__u32 pid)
{
	return filter_pids && !bpf_map_lookup_elem(&target_pids, &pid);
}

/* Processes whose driver view user space switched off (over its budget):
 * their driver calls are not traced, only counted here, and their exit
 * drops them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u64); /* calls not traced since */
} driver_off SEC(".maps");

/* Python processes and how to walk their interpreter, set by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct gpumem_python);
} python_procs SEC(".maps");

/* The Python stacks a thread's tensor allocations sent whole, by their hash
 * (python_stack_hash): two ways of GPUMEM_PY_SENT_SETS sets, 8 KiB a
 * thread. A tensor allocation whose stack is here names it instead
 * (GPUMEM_PY_SENT_BEFORE): a training step's tensors come from the same
 * few hundred stacks over and over, and a frame not sent is 32 bytes of
 * the ring buffer not written (at depth 40 that saves about what the hash
 * costs: bench/NOTES.md). A hash enters only once its event is in the ring
 * buffer, ahead of every event that names it; user space keeps a
 * process's stacks until it exits, and a thread's table goes with the
 * thread. */
#define GPUMEM_PY_SENT_SETS 512

/* What a thread's allocations need of its process, kept with the thread:
 * task local storage, freed with it, whose lookup reads the task where
 * python_procs' and traced_pids' hashes cost about 80 ns an allocation
 * between them. */
struct python_thread {
	struct gpumem_python py; /* the process's walk, when python */
	__u64 tstate;            /* the thread's PyThreadState, checked before use; 0: not found */
	__u64 generation;        /* python_generation when python and py were read; 0: never */
	__u64 cspan;             /* the C stack's window: as far as its last walk found shims (struct stack_window) */
	__u8 python;             /* the process is in python_procs */
	__u8 traced;             /* the process is in traced_pids */
	__u64 sent[2 * GPUMEM_PY_SENT_SETS]; /* 0: empty */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct python_thread);
} python_threads SEC(".maps");

/* Bumped by user space after each change to python_procs: a thread's copy
 * read at another generation is read again. gpumem starts it at 1, so that
 * a new thread's storage (0) reads it. Under stock IG it stays 0, and so
 * does python_procs: no thread reads it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} python_generation SEC(".maps");

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

/* One counter per kind of loss (enum gpumem_loss), summed by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GPUMEM_LOSS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} losses SEC(".maps");

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

/* wakeup_flags wake the reader, which polls, only when the ring buffer is
 * filling: a wakeup per event would cost more than the rest of the probe. */
static __always_inline __u64 wakeup_flags(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > GPUMEM_RINGBUF_BYTES / 4 ? BPF_RB_FORCE_WAKEUP
											   : BPF_RB_NO_WAKEUP;
}

/* output sends an event built in the scratch; false when it is dropped,
 * counted in events_lost_samples, as IG's helpers do. */
static __always_inline bool output(struct gpumem_event *e, __u64 size)
{
	if (!bpf_ringbuf_output(&events, e, size, wakeup_flags()))
		return true;
	count_lost_event();
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

static __always_inline __u64 read_ptr(__u64 addr)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

static __always_inline __u8 read_u8(__u64 addr)
{
	__u8 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

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

/* Bounds of the interpreter walks. */
#define GPUMEM_MAX_INTERPRETERS 4
#define GPUMEM_MAX_THREADS 256
/* Python frames plus the C-stack shim frames between them (3.12+). */
#define GPUMEM_MAX_PY_WALK (GPUMEM_MAX_PY_FRAMES + 32)

/* The interpreter walks run under bpf_loop, so that the verifier checks one
 * step rather than every iteration. Their state holds a copy of the
 * process's gpumem_python. */
struct find_thread {
	struct gpumem_python py;
	__u64 self;   /* the thread pointer sought */
	__u64 interp; /* interpreter being searched */
	__u64 ts;     /* next thread state to compare; 0: go to the next interpreter */
	__u64 found;
	__u32 interps;
};

static long find_thread_step(__u64 index, struct find_thread *c)
{
	if (!c->ts) {
		c->interp = c->interps == 0 ? read_ptr(c->py.runtime + c->py.runtime_interpreters_head)
					    : read_ptr(c->interp + c->py.interp_next);
		if (!c->interp || ++c->interps > GPUMEM_MAX_INTERPRETERS)
			return 1;
		c->ts = read_ptr(c->interp + c->py.interp_threads_head);
		return 0;
	}
	if (read_ptr(c->ts + c->py.tstate_thread_id) == c->self) {
		c->found = c->ts;
		return 1;
	}
	c->ts = read_ptr(c->ts + c->py.tstate_next);
	return 0;
}

/* thread_pointer is what pthread_self() returns in task. On arm64 glibc
 * it is not the thread register; Python stacks are x86-64 only. */
static __always_inline __u64 thread_pointer(struct task_struct *task)
{
#if defined(__TARGET_ARCH_x86)
	return task->thread.fsbase;
#else
	return 0;
#endif
}

/* The thread state's fields a walk reads (its frame, its thread id, its
 * data stack chunk), read at once from the first of them, the frame: they
 * lie within GPUMEM_PY_TSTATE_HEAD bytes of it in 3.10 to 3.13 (package
 * pystack refuses a layout where they do not), so that a thread state
 * costs one read of user memory instead of three. */
#define GPUMEM_PY_TSTATE_HEAD 256

/* aligned_u64 is the 8 bytes at bytes[i], in an 8-byte aligned buffer,
 * loaded at once, where the compiler, knowing only a byte's alignment,
 * would assemble them byte by byte: 8 loads and 14 shifts and ors a field.
 * The fields read so are 8-byte aligned in CPython's thread states and
 * frames, which are (package pystack refuses a layout where one is not).
 * Only the compiler is told so: the verifier and the JIT allow an
 * unaligned load on x86-64, so a frame chain that is not aligned (a
 * corrupt one) is still read as it is. Checking i's alignment instead
 * doubles the paths the verifier walks (gpumem_leave: 55% to 94% of its
 * limit). */
static __always_inline __u64 aligned_u64(const __u8 *bytes, __u64 i)
{
	return *(const __u64 *)__builtin_assume_aligned(&bytes[i], 8);
}

struct tstate_head {
	__u8 bytes[GPUMEM_PY_TSTATE_HEAD] __attribute__((aligned(8)));
	__u16 lo; /* the offset of bytes[0] in the thread state: its frame's */
};

/* read_tstate_head reads thread state ts's fields into h; false when they
 * cannot be read. */
static __always_inline bool read_tstate_head(struct tstate_head *h, const struct gpumem_python *py, __u64 ts)
{
	h->lo = py->tstate_frame;
	return bpf_probe_read_user(h->bytes, sizeof(h->bytes), (void *)(ts + py->tstate_frame)) == 0;
}

static __always_inline __u64 tstate_u64(const struct tstate_head *h, __u16 off)
{
	__u64 i = (__u16)(off - h->lo);
	if (i > sizeof(h->bytes) - 8)
		return 0;
	return aligned_u64(h->bytes, i);
}

/* find_thread_state reads the PyThreadState of the calling thread t into h,
 * found by its thread pointer: PyThreadState.thread_id is pthread_self(),
 * which on x86-64 is the fs base. The GIL holder is not used: ctypes and
 * PyTorch release the GIL around native calls. False when there is none,
 * or its fields cannot be read. */
static __always_inline bool find_thread_state(struct tstate_head *h, struct python_thread *t)
{
	__u64 self = thread_pointer(bpf_get_current_task_btf());

	if (t->tstate && read_tstate_head(h, &t->py, t->tstate) && tstate_u64(h, t->py.tstate_thread_id) == self)
		return true;
	struct find_thread c = {.py = t->py, .self = self};
	bpf_loop(GPUMEM_MAX_INTERPRETERS * (GPUMEM_MAX_THREADS + 1), find_thread_step, &c, 0);
	t->tstate = c.found;
	return c.found && read_tstate_head(h, &t->py, c.found);
}

/* A frame's first bytes, read at once: every field the walk follows lies in
 * them in 3.10 to 3.13 (3.10's f_lasti ends at 100; package pystack refuses
 * a layout where one does not), so that a frame costs one read of user
 * memory instead of four. A frame whose first bytes cannot all be read (at
 * the end of a mapping) has its first GPUMEM_PY_FRAME_MIN read, which hold
 * the fields of 3.11 to 3.13. */
#define GPUMEM_PY_FRAME_HEAD 128
#define GPUMEM_PY_FRAME_MIN 72

/* The calling thread's data stack (3.11+), read at once: the frames a walk
 * follows lie in it, one below the other, so that a walk costs one read of
 * user memory however deep. Frames outside it (generators', C-stack shims,
 * an older chunk) have their heads read one by one into its slot, past the
 * stack's bytes: every field of every frame is read from one buffer, which
 * keeps the walk's paths, and the verifier's work, few. It holds the bytes
 * from lo to the top frame's head. */
#define GPUMEM_PY_STACK_WINDOW 16384
#define GPUMEM_PY_SLOT GPUMEM_PY_STACK_WINDOW

/* The C stack's window (3.12+): shim frames live on the C stack, each
 * beside the _PyCFrame of its evaluation loop (3.12), a nested call's C
 * frames apart (550-800 bytes for a Python __call__, as nn.Module's: a
 * transformers Llama's 16 shims lie within 10 KiB; the window holds 40).
 * A walk reads the C stack once from the thread's _PyCFrame (3.11, 3.12:
 * the read of the top frame it replaces), as far above it as the thread's
 * last walk found shims; a shim inside it is passed where its callee is
 * read (pass_window_shim), one outside it is read alone. A shim read alone
 * costs about 140 ns, the window's bytes about 14 ns between two shims.
 * 3.13 has no _PyCFrame: its shims are read one by one. */
#define GPUMEM_PY_CSTACK_WINDOW 32768
#define GPUMEM_PY_CSTACK (GPUMEM_PY_SLOT + GPUMEM_PY_FRAME_HEAD)

/* A window is 48 KiB, more than a per-CPU map's value may be (32 KiB): the
 * windows are an array with an entry per CPU, which gpumem sizes to the
 * host's possible CPUs at load. On a CPU past them (stock IG on a larger
 * host) a walk reads no Python frames and says so. */
#define GPUMEM_STACK_WINDOWS 256

struct stack_window {
	/* What a walk reads besides the frames, first, beside the data
	 * stack's window's start: one lookup and one page for all of it. */
	__u64 lo;
	__u64 len;  /* 0: nothing read */
	__u64 clo;  /* the C stack's window */
	__u64 clen; /* 0: nothing read */
	struct tstate_head head;
	/* the data stack's window, the slot, the C stack's window (and room
	 * for a frame's head past it, which the verifier cannot tell unused) */
	__u8 bytes[GPUMEM_PY_STACK_WINDOW + GPUMEM_PY_FRAME_HEAD + GPUMEM_PY_CSTACK_WINDOW + GPUMEM_PY_FRAME_HEAD]
		__attribute__((aligned(8)));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GPUMEM_STACK_WINDOWS);
	__type(key, __u32);
	__type(value, struct stack_window);
} stack_windows SEC(".maps");

/* this_cpu_window returns this CPU's stack window: its user is the holder
 * of this CPU's scratch event (hold_scratch). */
static __always_inline struct stack_window *this_cpu_window(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	return bpf_map_lookup_elem(&stack_windows, &cpu);
}

/* read_stack_window reads the thread's data stack chunk, from its start or
 * as far below the top frame as the window holds, up to the top frame's
 * head. A window from the chunk's start holds the chunk's size
 * (_PyStackChunk: previous, size, top, data), checked there after the
 * read: a read of user memory fewer (about 60 ns) than reading it first. */
static __always_inline void read_stack_window(struct stack_window *w, const struct gpumem_python *py,
					      const struct tstate_head *h, __u64 top)
{
	w->len = 0;
	if (py->tstate_datastack_chunk == GPUMEM_PY_NO_FIELD || !top)
		return;
	__u64 chunk = tstate_u64(h, py->tstate_datastack_chunk);
	__u64 end = top + GPUMEM_PY_FRAME_HEAD;
	if (!chunk || top < chunk)
		return;
	__u64 lo = chunk;
	if (end - chunk > GPUMEM_PY_STACK_WINDOW) {
		if (end > chunk + read_ptr(chunk + 8))
			return;
		lo = end - GPUMEM_PY_STACK_WINDOW;
	}
	__u64 len = end - lo;
	if (len > GPUMEM_PY_STACK_WINDOW || bpf_probe_read_user(w->bytes, len, (void *)lo))
		return;
	if (lo == chunk && end > chunk + aligned_u64(w->bytes, 8))
		return;
	w->lo = lo;
	w->len = len;
}

/* read_cstack_window reads the C stack's window from at, span bytes (at
 * least a frame's head); false when they cannot be read. */
static __always_inline bool read_cstack_window(struct stack_window *w, __u64 at, __u64 span)
{
	if (span < GPUMEM_PY_FRAME_HEAD)
		span = GPUMEM_PY_FRAME_HEAD;
	if (span > GPUMEM_PY_CSTACK_WINDOW)
		span = GPUMEM_PY_CSTACK_WINDOW;
	w->clo = at;
	w->clen = 0;
	if (bpf_probe_read_user(&w->bytes[GPUMEM_PY_CSTACK], span, (void *)at))
		return false;
	w->clen = span;
	return true;
}

/* cstack_window_holds is all ones when a C stack's window holds reach
 * (below the window's start, it wrapped), else 0, computed without a
 * branch: a branch in the walk doubles the paths the verifier walks
 * (gpumem_leave: 54% to 68% of its limit). */
static __always_inline __u64 cstack_window_holds(__u64 reach)
{
	__u64 over = reach / GPUMEM_PY_CSTACK_WINDOW; /* 0 when it holds it */
	return ((over | -over) >> 63) - 1;
}

/* locate_frame returns where frame's head is in w: in the data stack's
 * window, or in the slot, copied from the C stack's window or read;
 * GPUMEM_PY_UNREADABLE when it cannot be read. *creach keeps how far above
 * the C stack's window's start the last frame it holds lies: the farthest,
 * as a walk goes up the C stack from its innermost shim. (The larger of
 * two, computed without a branch, takes the verifier past its limit.) */
#define GPUMEM_PY_UNREADABLE (~0ULL)

static __always_inline __u64 locate_frame(struct stack_window *w, __u64 frame, __u64 *creach)
{
	if (frame >= w->lo && frame - w->lo + GPUMEM_PY_FRAME_HEAD <= w->len)
		return frame - w->lo;
	__u64 reach = frame - w->clo + GPUMEM_PY_FRAME_HEAD;
	__u64 holds = cstack_window_holds(reach);
	*creach = (reach & holds) | (*creach & ~holds);
	if (frame >= w->clo && reach <= w->clen) {
		/* Copied into the slot, so that a frame is in one of two places:
		 * a third doubles the paths the verifier walks, as an inlined copy
		 * does. The mask changes nothing (clen is at most the window's
		 * size, a power of 2): it tells the verifier the copy's bounds. */
		__u64 off = (reach - GPUMEM_PY_FRAME_HEAD) & (GPUMEM_PY_CSTACK_WINDOW - 1);
		if (bpf_probe_read_kernel(&w->bytes[GPUMEM_PY_SLOT], GPUMEM_PY_FRAME_HEAD, &w->bytes[GPUMEM_PY_CSTACK + off]))
			return GPUMEM_PY_UNREADABLE;
		return GPUMEM_PY_SLOT;
	}
	if (bpf_probe_read_user(&w->bytes[GPUMEM_PY_SLOT], GPUMEM_PY_FRAME_HEAD, (void *)frame) &&
	    bpf_probe_read_user(&w->bytes[GPUMEM_PY_SLOT], GPUMEM_PY_FRAME_MIN, (void *)frame))
		return GPUMEM_PY_UNREADABLE;
	return GPUMEM_PY_SLOT;
}

/* frame_u64 and frame_u8 read the field at offset off of the frame at at
 * in w. */
static __always_inline __u64 frame_u64(const struct stack_window *w, __u64 at, __u16 off)
{
	__u64 i = at + off;
	if (i > sizeof(w->bytes) - 8)
		return 0;
	return aligned_u64(w->bytes, i);
}

static __always_inline __u8 frame_u8(const struct stack_window *w, __u64 at, __u16 off)
{
	__u64 i = at + off;
	if (i > sizeof(w->bytes) - 1)
		return 0;
	return w->bytes[i];
}

static __always_inline void read_frame(const struct gpumem_python *py, const struct stack_window *w, __u64 at,
				       __u64 frame, struct gpumem_pyframe *f)
{
	f->code = frame_u64(w, at, py->frame_code);
	f->instr = frame_u64(w, at, py->frame_instr);
	if (py->instr_size == 4)
		f->instr &= 0xffffffff;
	f->cls = 0;
	f->flags = 0;
	if (py->frame_is_entry != GPUMEM_PY_NO_FIELD && frame_u8(w, at, py->frame_is_entry))
		f->flags = GPUMEM_PYFRAME_ENTRY;
	if (py->frame_localsplus != GPUMEM_PY_NO_FIELD) {
		/* 3.10: one evaluation loop per frame; no qualified names, so keep
		 * the class of the first argument: the object itself when it is
		 * a class (cls), else its type (self). */
		f->flags = GPUMEM_PYFRAME_ENTRY;
		__u64 arg = read_ptr(frame + py->frame_localsplus);
		if (arg) {
			__u64 type = read_ptr(arg + 8); /* ob_type */
			__u64 tp_flags = read_ptr(type + py->type_flags);
			f->cls = tp_flags & (1UL << 31) /* Py_TPFLAGS_TYPE_SUBCLASS */ ? arg : type;
		}
	}
}

struct walk_frames {
	struct gpumem_python py;
	__u64 frame;
	__u64 creach; /* as far as this walk finds shims above the C stack's window's start */
	__u32 n;
	__u16 flags;
};

/* Masks, all ones when the comparison holds, else 0, computed without a
 * branch (see cstack_window_holds); a and b below 2^63. */
static __always_inline __u64 equal_mask(__u64 a, __u64 b)
{
	__u64 v = a ^ b;
	return ((v | -v) >> 63) - 1;
}

static __always_inline __u64 at_most_mask(__u64 a, __u64 b)
{
	return ((b - a) >> 63) - 1;
}

/* cstack_u64 and cstack_u8 read the C stack's window at offset off,
 * bounded by a mask instead of a branch. */
static __always_inline __u64 cstack_u64(const struct stack_window *w, __u64 off)
{
	return aligned_u64(w->bytes, GPUMEM_PY_CSTACK + (off & (GPUMEM_PY_CSTACK_WINDOW - 1)));
}

static __always_inline __u8 cstack_u8(const struct stack_window *w, __u64 off)
{
	return w->bytes[GPUMEM_PY_CSTACK + (off & (GPUMEM_PY_CSTACK_WINDOW - 1))];
}

/* pass_window_shim moves c past its frame when that is a shim the C
 * stack's window holds, to the shim's caller, and flags f, the frame the
 * shim entered, an entry. Without a branch: the window's bytes are read
 * either way (at its start, which the walk just read, when it does not
 * hold the frame), and what is kept is chosen by masks. A shim so passed
 * costs no step of the walk and no copy into the slot (about 40 ns each: a
 * Llama's allocation passes 16). A shim the window does not hold is
 * walked as a frame. */
static __always_inline void pass_window_shim(struct walk_frames *c, struct gpumem_pyframe *f,
					     const struct stack_window *w)
{
	__u64 reach = c->frame - w->clo + GPUMEM_PY_FRAME_HEAD;
	__u64 held = cstack_window_holds(reach) & at_most_mask(reach, w->clen);
	__u64 off = (reach - GPUMEM_PY_FRAME_HEAD) & held;
	__u64 shim = held & ~equal_mask(c->py.owner_cstack, 0) &
		     equal_mask(cstack_u8(w, off + c->py.frame_owner), c->py.owner_cstack);
	c->frame = (cstack_u64(w, off + c->py.frame_previous) & shim) | (c->frame & ~shim);
	c->creach = (reach & shim) | (c->creach & ~shim);
	f->flags |= GPUMEM_PYFRAME_ENTRY & shim;
}

/* walk_frame reads one frame into e->pystack and moves c to its caller;
 * false when the walk is over. */
static __always_inline bool walk_frame(struct walk_frames *c, struct gpumem_event *e, struct stack_window *w)
{
	if (!c->frame)
		return false;
	if (c->n >= GPUMEM_MAX_PY_FRAMES) {
		c->flags |= GPUMEM_PY_TRUNCATED;
		return false;
	}
	__u64 at = locate_frame(w, c->frame, &c->creach);
	if (at == GPUMEM_PY_UNREADABLE) {
		c->flags |= GPUMEM_PY_READ_ERROR;
		return false;
	}
	if (c->py.owner_cstack && frame_u8(w, at, c->py.frame_owner) == c->py.owner_cstack) {
		/* A shim: the frame inside it was entered from C. */
		if (c->n > 0)
			e->pystack[(c->n - 1) & (GPUMEM_MAX_PY_FRAMES - 1)].flags |= GPUMEM_PYFRAME_ENTRY;
		c->frame = frame_u64(w, at, c->py.frame_previous);
		return true;
	}
	struct gpumem_pyframe *f = &e->pystack[c->n & (GPUMEM_MAX_PY_FRAMES - 1)];
	read_frame(&c->py, w, at, c->frame, f);
	c->n++;
	c->frame = frame_u64(w, at, c->py.frame_previous);
	/* A caller in the data stack's window is no shim (shims live on the
	 * C stack): most callers skip pass_window_shim's masks. One compare,
	 * not locate_frame's two: a second branch here takes gpumem_leave
	 * from 69% to 70% of the verifier's limit. */
	if (c->frame - w->lo >= w->len)
		pass_window_shim(c, f, w);
	return true;
}

/* A walk that takes the frames the data stack's window holds first: what
 * walk_window_frame needs besides the walk's state. Apart from struct
 * walk_frames, whose layout the other walking programs' verification
 * turns on (two fields more there take gpumem_leave from 69% to 84% of
 * the verifier's limit). Both fields follow from py, computed once: from
 * py in each frame's step, with or without a branch, gpumem_tensor passes
 * the verifier's limit. */
struct window_walk {
	struct walk_frames c;
	__u64 instr_mask; /* the instruction's bytes (py.instr_size) */
	__u32 entry_flag; /* GPUMEM_PYFRAME_ENTRY where frames have is_entry (3.11), else 0 */
};

/* walk_window_frame reads a frame the data stack's window holds into
 * e->pystack and moves the walk to its caller, as walk_frame does with
 * fewer instructions (about 30 against 85 a frame): such a frame is no
 * shim (shims live on the C stack) and its fields lie in the window's
 * bytes (pystack checks that a 3.11+ layout's lie in a frame's first
 * GPUMEM_PY_FRAME_MIN bytes; the masks only tell the verifier so). False
 * when the window does not hold the walk's frame or the walk is full:
 * walk_frame takes it from there. */
static __always_inline bool walk_window_frame(struct window_walk *ww, struct gpumem_event *e,
					      const struct stack_window *w)
{
	struct walk_frames *c = &ww->c;
	__u64 at = c->frame - w->lo;
	if (at > GPUMEM_PY_STACK_WINDOW - GPUMEM_PY_FRAME_HEAD || at + GPUMEM_PY_FRAME_HEAD > w->len ||
	    c->n >= GPUMEM_MAX_PY_FRAMES)
		return false;
	struct gpumem_pyframe *f = &e->pystack[c->n & (GPUMEM_MAX_PY_FRAMES - 1)];
	f->code = aligned_u64(w->bytes, at + (c->py.frame_code & (GPUMEM_PY_FRAME_HEAD - 1)));
	f->instr = aligned_u64(w->bytes, at + (c->py.frame_instr & (GPUMEM_PY_FRAME_HEAD - 1))) & ww->instr_mask;
	f->cls = 0;
	__u32 entry = w->bytes[at + (c->py.frame_is_entry & (GPUMEM_PY_FRAME_HEAD - 1))];
	f->flags = ((0 - entry) >> 31) & ww->entry_flag;
	c->n++;
	c->frame = aligned_u64(w->bytes, at + (c->py.frame_previous & (GPUMEM_PY_FRAME_HEAD - 1)));
	if (c->frame - w->lo >= w->len)
		pass_window_shim(c, f, w);
	return true;
}

/* Frames one bpf_loop step walks: a step's call and map lookups cost about
 * what reading a frame from the window does. */
#define GPUMEM_PY_FRAMES_PER_STEP 4

/* Frames one step of the window's walk takes: its frames cost a third of
 * walk_frame's instructions, so that in torch's process a step's call and
 * lookups weigh more (8: 412 against 466 ns a run on an H100 machine,
 * BENCHMARKS.md). 16 take gpumem_tensor past the verifier's limit. */
#define GPUMEM_PY_WINDOW_FRAMES_PER_STEP 8

/* walk_buffers finds what a step of a walk reads and writes: this CPU's
 * scratch event and stack window; false when one is missing. */
static __always_inline bool walk_buffers(struct gpumem_event **e, struct stack_window **w)
{
	__u32 zero = 0;
	*e = bpf_map_lookup_elem(&scratch, &zero);
	*w = this_cpu_window();
	return *e && *w;
}

static long walk_window_step(__u64 index, struct window_walk *ww)
{
	struct gpumem_event *e;
	struct stack_window *w;
	if (!walk_buffers(&e, &w))
		return 1;
	for (int i = 0; i < GPUMEM_PY_WINDOW_FRAMES_PER_STEP; i++)
		if (!walk_window_frame(ww, e, w))
			return 1;
	return 0;
}

/* walk_window walks c's frames the data stack's window holds, from its
 * top frame down to the first the window does not hold. */
static __always_inline void walk_window(struct walk_frames *c)
{
	struct window_walk ww = {
		.c = *c,
		.instr_mask = c->py.instr_size == 4 ? 0xffffffff : ~0ULL,
		.entry_flag = c->py.frame_is_entry != GPUMEM_PY_NO_FIELD ? GPUMEM_PYFRAME_ENTRY : 0,
	};
	bpf_loop(GPUMEM_MAX_PY_WALK / GPUMEM_PY_WINDOW_FRAMES_PER_STEP, walk_window_step, &ww, 0);
	*c = ww.c;
}

static long walk_frames_step(__u64 index, struct walk_frames *c)
{
	struct gpumem_event *e;
	struct stack_window *w;
	if (!walk_buffers(&e, &w))
		return 1;
	for (int i = 0; i < GPUMEM_PY_FRAMES_PER_STEP; i++)
		if (!walk_frame(c, e, w))
			return 1;
	return 0;
}

/* current_frame reads the top frame from the thread's _PyCFrame at cframe
 * (3.11, 3.12), with the C stack above it as far as span. */
static __always_inline __u64 current_frame(struct stack_window *w, __u64 cframe, __u16 off, __u64 span)
{
	if (off < GPUMEM_PY_FRAME_HEAD - 8 && read_cstack_window(w, cframe, span))
		return frame_u64(w, GPUMEM_PY_CSTACK, off);
	return read_ptr(cframe + off);
}

/* thread_of returns the calling thread's python_thread, its process's walk
 * read again when python_procs changed since; NULL when the thread's
 * storage cannot be made. */
static __always_inline struct python_thread *thread_of(__u32 pid)
{
	__u32 zero = 0;
	__u64 *generation = bpf_map_lookup_elem(&python_generation, &zero);
	struct python_thread *t =
		bpf_task_storage_get(&python_threads, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t || !generation)
		return NULL;
	__u64 now = *(volatile __u64 *)generation; /* before python_procs, which changes first */
	if (t->generation == now)
		return t;
	struct gpumem_python *py = bpf_map_lookup_elem(&python_procs, &pid);
	t->python = py != NULL;
	if (py)
		t->py = *py;
	t->generation = now;
	return t;
}

/* capture_python walks the calling thread t's Python frames, innermost
 * first, into e->pystack. A thread whose storage could not be made has its
 * Python process's frames flagged missing. With window_first, the frames
 * the data stack's window holds are walked by their own loop first (the
 * tensor probes: their walks are most of what the agent costs); the other
 * walking programs leave it out, which would take gpumem_leave from 69% to
 * 86% of the verifier's limit. */
static __always_inline void capture_python(struct gpumem_event *e, struct python_thread *t, bool window_first)
{
	if (!t) {
		if (bpf_map_lookup_elem(&python_procs, &e->proc.pid))
			e->stack_flags = GPUMEM_PY_NO_THREAD;
		return;
	}
	if (!t->python)
		return;
	struct stack_window *w = this_cpu_window();
	if (!w) {
		e->stack_flags = GPUMEM_PY_READ_ERROR;
		return;
	}
	struct tstate_head *h = &w->head;
	if (!find_thread_state(h, t)) {
		e->stack_flags = GPUMEM_PY_NO_THREAD;
		return;
	}
	struct gpumem_python *py = &t->py;
	struct walk_frames c = {.py = *py, .frame = tstate_u64(h, py->tstate_frame)};
	w->clo = w->clen = 0;
	if (py->cframe_current_frame != GPUMEM_PY_NO_FIELD)
		c.frame = current_frame(w, c.frame, py->cframe_current_frame, t->cspan);
	read_stack_window(w, py, h, c.frame);
	if (window_first)
		walk_window(&c);
	bpf_loop(GPUMEM_MAX_PY_WALK / GPUMEM_PY_FRAMES_PER_STEP, walk_frames_step, &c, 0);
	t->cspan = c.creach;
	if (c.frame && !c.flags)
		c.flags = GPUMEM_PY_TRUNCATED; /* more shims than the walk allows */
	e->pystack_len = c.n;
	e->stack_flags = c.flags;
}

/* capture_stack puts the native user stack right after the Python frames:
 * the probed instruction, then the return address of each frame, following
 * the frame pointers (saved frame pointer, then return address, at each).
 * The walk reads 16 bytes a frame, a third of what bpf_get_stack costs on
 * these call paths (BENCHMARKS.md). It ends at the first unreadable frame,
 * a zero return address, or a frame pointer that does not climb the stack
 * (code built without frame pointers), as the kernel's unwinder does. A
 * deeper stack keeps its innermost GPUMEM_MAX_STACK_DEPTH frames, as
 * bpf_get_stack does, and is flagged. */
static __always_inline __u32 capture_stack(struct pt_regs *ctx, struct gpumem_event *e, bool walk)
{
	__u32 py = e->pystack_len;
	if (py > GPUMEM_MAX_PY_FRAMES)
		py = GPUMEM_MAX_PY_FRAMES;
	__u64 *frames = (__u64 *)&e->pystack[py];
	__u64 fp = PT_REGS_FP(ctx);
	__u32 n = 1;

	frames[0] = PT_REGS_IP(ctx);
	if (!walk)
		return n;
	for (int i = 1; i < GPUMEM_MAX_STACK_DEPTH; i++) {
		__u64 frame[2]; /* the caller's frame pointer, the return address */
		if (bpf_probe_read_user(frame, sizeof(frame), (void *)fp) || frame[1] == 0)
			return n;
		frames[i] = frame[1];
		n++;
		if (frame[0] <= fp)
			return n;
		fp = frame[0];
	}
	__u64 frame[2];
	if (bpf_probe_read_user(frame, sizeof(frame), (void *)fp) == 0 && frame[1] != 0)
		e->stack_flags |= GPUMEM_NATIVE_TRUNCATED;
	return n;
}

/* python_stack_hash hashes e's Python frames, every field user space reads,
 * never 0 (an empty slot of python_thread.sent). Two multiplicative lanes,
 * so that a frame costs about four cycles, not eight: 64 bits, two stacks
 * of a thread collide about once in 2^64 pairs. tracer's pyStackHash is
 * the same function. */
#define GPUMEM_PY_HASH_CODE 0x9e3779b97f4a7c15ULL
#define GPUMEM_PY_HASH_REST 0xc2b2ae3d27d4eb4fULL

static __always_inline __u64 python_stack_hash(const struct gpumem_event *e)
{
	__u64 code = GPUMEM_PY_HASH_CODE, rest = GPUMEM_PY_HASH_REST;
	__u32 n = e->pystack_len;
	for (__u32 i = 0; i < GPUMEM_MAX_PY_FRAMES && i < n; i++) {
		const struct gpumem_pyframe *f = &e->pystack[i];
		code = (code ^ f->code ^ (f->cls << 32 | f->cls >> 32)) * GPUMEM_PY_HASH_CODE;
		rest = (rest ^ f->instr ^ (__u64)f->flags << 56) * GPUMEM_PY_HASH_REST;
	}
	__u64 h = code ^ (rest << 32 | rest >> 32) ^ n;
	h = (h ^ h >> 31) * GPUMEM_PY_HASH_CODE;
	return (h ^ h >> 29) | 1;
}

/* A hash to enter into a thread's table once its event is sent whole. */
struct sent_stack {
	__u64 *way;
	__u64 hash;
};

/* name_sent_stack puts in e, in place of its Python frames, their hash when
 * t's thread sent them whole before; else it says in *sent where their
 * hash goes once this event is sent. Stacks of one frame are sent as they
 * are: a frame is as long as the hash's entry. */
static __always_inline void name_sent_stack(struct gpumem_event *e, struct python_thread *t, struct sent_stack *sent)
{
	if (!t || e->pystack_len < 2)
		return;
	__u64 h = python_stack_hash(e);
	__u32 set = (h & (GPUMEM_PY_SENT_SETS - 1)) * 2;
	__u64 *ways = &t->sent[set];
	if (ways[0] == h || ways[1] == h) {
		e->pystack[0] = (struct gpumem_pyframe){.code = h, .instr = e->pystack_len};
		e->pystack_len = 1;
		e->stack_flags |= GPUMEM_PY_SENT_BEFORE;
		return;
	}
	/* An empty way first, so that two stacks of a set both stay. */
	sent->way = !ways[0] ? &ways[0] : !ways[1] ? &ways[1] : &ways[(h >> 32) & 1];
	sent->hash = h;
}

static __always_inline __u64 event_size(const struct gpumem_event *e)
{
	__u64 size = offsetof(struct gpumem_event, pystack) +
		     e->pystack_len * sizeof(e->pystack[0]) + e->ustack_len * sizeof(e->ustack[0]);
	return size > sizeof(*e) ? sizeof(*e) : size;
}

/* begin_header fills the header of a call event with its process's pid
 * and tid only: the whole header of a tensor allocation, whose comm (a
 * read of about 70 ns) user space has from the process's driver calls or
 * /proc. Only gpumem attaches the tensor probes. */
static __always_inline void begin_header(struct gpumem_event *e, __u16 op, __s32 result)
{
	__u64 id = bpf_get_current_pid_tgid();
	e->type = GPUMEM_EVENT_CALL;
	e->op = op;
	e->result = result;
	e->proc = (struct gadget_process){.pid = id >> 32, .tid = (__u32)id};
	e->ustack_len = 0;
	e->pystack_len = 0;
	e->stack_flags = 0;
	e->device = GPUMEM_DEVICE_UNKNOWN;
}

/* begin_event fills the header of a call event. Stock IG gets the whole
 * process (parent, credentials, mount namespace for its Kubernetes
 * enrichment); gpumem reads the pid, tid and comm only. */
static __always_inline void begin_event(struct gpumem_event *e, __u16 op, __s32 result, bool stock_ig)
{
	begin_header(e, op, result);
	if (stock_ig)
		gadget_process_populate(&e->proc);
	else
		bpf_get_current_comm(e->proc.comm, sizeof(e->proc.comm));
}

/* Threads allocating to a private pool of PyTorch's allocator: between
 * NativeCachingAllocator::beginAllocateToPool and endAllocateToPool (a
 * CUDA graph's capture, graph trees' warm-up and recording,
 * torch.cuda.use_mem_pool), the allocations they make, segments and
 * tensors, belong to the pool (docs/pytorch-allocator-books.md). The
 * count of pools the thread has begun and not ended. An LRU map: a thread
 * that never ends (an exception between the two) makes room for others. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024); /* threads allocating to a pool at once */
	__type(key, __u64);        /* pid_tgid */
	__type(value, __u32);
} pool_threads SEC(".maps");

/* How many threads pool_threads holds: while none, an allocation skips its
 * lookup there (an array's lookup is a load; a hash's, a hash). An entry
 * the LRU map drops leaves it high: lookups that find nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} pool_thread_count SEC(".maps");

/* in_pool says whether the thread of process pid, thread tid allocates to
 * a private pool. */
static __always_inline bool in_pool(__u32 pid, __u32 tid)
{
	__u32 zero = 0;
	__u64 *threads = bpf_map_lookup_elem(&pool_thread_count, &zero);
	if (!threads || *threads == 0)
		return false;
	__u64 id = (__u64)pid << 32 | tid;
	return bpf_map_lookup_elem(&pool_threads, &id) != NULL;
}

static __always_inline void count_pool_threads(__s64 by)
{
	__u32 zero = 0;
	__u64 *threads = bpf_map_lookup_elem(&pool_thread_count, &zero);
	if (threads)
		__sync_fetch_and_add(threads, by);
}

/* capture_allocation adds an allocation's Python and native stacks, and
 * marks its process so that its exit is reported. Without native_walk, a
 * call with Python frames keeps the probed instruction alone: the Python
 * frames say where it comes from. With sent (the tensor probes), Python
 * frames its thread sent before are named by their hash
 * (name_sent_stack). */
static __always_inline void capture_allocation(struct pt_regs *ctx, struct gpumem_event *e, bool native_walk,
					       struct sent_stack *sent)
{
	struct python_thread *t = thread_of(e->proc.pid);
	capture_python(e, t, sent != NULL);
	if (sent)
		name_sent_stack(e, t, sent);
	bool partial = e->stack_flags & ~GPUMEM_PY_SENT_BEFORE;
	e->ustack_len = capture_stack(ctx, e, native_walk || e->pystack_len == 0 || partial);
	if (in_pool(e->proc.pid, e->proc.tid))
		e->stack_flags |= GPUMEM_GRAPH_POOL; /* after the walk, which other flags force */
	if (t && t->traced)
		return; /* traced_pids keeps a process until its last thread exits */
	__u8 one = 1;
	if (!bpf_map_lookup_elem(&traced_pids, &e->proc.pid) &&
	    bpf_map_update_elem(&traced_pids, &e->proc.pid, &one, BPF_ANY)) {
		count_loss(GPUMEM_LOSS_PROCESSES_FULL);
		return;
	}
	if (t)
		t->traced = 1;
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

/* leave_context applies a context call that succeeded. */
static __always_inline int leave_context(struct pt_regs *ctx, const struct gpumem_call *call, __u64 id)
{
	if (PT_REGS_RC(ctx) == 0)
		track_context(call, (__u32)id);
	return 0;
}

/* ---- CUDA contexts made and destroyed, for the reconciliation with NVML
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

/* ---- end of CUDA contexts made and destroyed */

/* report_allocation turns a returning allocation into an event, stamped at
 * its return, when the pointer became valid; e is the scratch, held. With
 * stock_ig (IG's per-function programs) it also keeps the in-kernel
 * totals. With context, it reports that context made instead: one path to
 * the stack capture, which the verifier then walks once. */
static __always_inline void report_allocation(struct pt_regs *ctx, struct gpumem_event *e,
					      const struct gpumem_call *call, bool stock_ig, __u64 context)
{
	if (context) {
		begin_context(e, call, context);
	} else {
		begin_event(e, call->op, (__s32)PT_REGS_RC(ctx), stock_ig);
		e->timestamp = bpf_ktime_get_ns();
		e->address = 0;
		e->bytes = call->bytes;
		if (e->result == 0 && !finish_allocation(e, call))
			return;
		e->device = current_device(call, e->proc.tid);
	}
	capture_allocation(ctx, e, true, NULL);
	if (stock_ig && aggregate)
		aggregate_allocation(ctx, e);
	output(e, event_size(e));
}

/* report_tensor_free sends a tensor free as a record of its own
 * (struct gpumem_tensor_free): PyTorch frees a tensor as often as it makes
 * one, and a call event's header is two cache lines of the ring buffer,
 * with a comm and a process zeroed, where a tensor free needs a third of
 * one. Stock IG never sees it: only gpumem attaches the tensor probes. */
static __always_inline int report_tensor_free(__u64 address)
{
	struct gpumem_tensor_free *f = bpf_ringbuf_reserve(&events, sizeof(*f), 0);
	if (!f) {
		count_lost_event();
		return 0;
	}
	__u64 id = bpf_get_current_pid_tgid();
	f->timestamp = bpf_ktime_get_ns();
	f->address = address;
	f->pid = id >> 32;
	f->tid = (__u32)id;
	submit(f);
	return 0;
}

/* report_address sends an event that names one address: a free, at its
 * entry, before the driver could hand the pointer out again, so that user
 * space orders a free and a reuse of the same pointer racing on two
 * threads; or the handle a retain returned. A free has no return probe: one
 * trap fewer per pair. Its result is not read: a refused free is a free of
 * a pointer gpu-mem never saw allocated, an unknown free to user space. */
static __always_inline int report_address(__u16 op, __u64 address, bool stock_ig)
{
	struct gpumem_event *e = reserve_header();
	if (!e)
		return 0;
	begin_event(e, op, 0, stock_ig);
	e->timestamp = bpf_ktime_get_ns();
	e->address = address;
	e->bytes = 0;
	if (stock_ig && aggregate && gpumem_op_is_free(op))
		release(e);
	submit(e);
	return 0;
}

/* report_retain sends the handle a successful cuMemRetainAllocationHandle
 * returned: it will be released once more. A refused one changes nothing.
 * Stock IG's per-function programs leave it out: their in-kernel totals
 * release a handle at its first cuMemRelease. */
static __always_inline int report_retain(struct pt_regs *ctx, const struct gpumem_call *call)
{
	__u64 handle;
	if (PT_REGS_RC(ctx) != 0)
		return 0;
	if (bpf_probe_read_user(&handle, sizeof(handle), (void *)call->target)) {
		count_loss(GPUMEM_LOSS_READ_RESULT);
		return 0;
	}
	return report_address(call->op, handle, false);
}


/* module_loaded is the module or library a successful load returned, else
 * 0; a successful unload is reported here, by its handle, once the driver
 * let its images go (NVML, read after it, no longer counts them). Reported
 * by gpumem's own attach only, for the reconciliation with NVML
 * (profiler/gpumemory.go). */
static __always_inline __u64 module_loaded(struct pt_regs *ctx, const struct gpumem_call *call)
{
	if (PT_REGS_RC(ctx) != 0)
		return 0;
	if (gpumem_op_unloads_module(call->op)) {
		report_address(call->op, call->target, false);
		return 0;
	}
	return read_ptr(call->target); /* the out-parameter */
}

/* Thread exit: drop a call the thread never returned from; on the last
 * thread of a traced process, report the exit so that user space releases
 * what the process still held. */
SEC("raw_tracepoint/sched_process_exit")
int gpumem_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;

	bpf_map_delete_elem(&inflight, &id);
	__u32 tid = (__u32)id;
	bpf_map_delete_elem(&thread_contexts, &tid);

	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	forget_contexts(pid); /* whether it allocated or not */
	bpf_map_delete_elem(&driver_off, &pid);
	if (bpf_map_delete_elem(&traced_pids, &pid))
		return 0;
	if (aggregate) {
		release_class(pid, CUDA_MEM_DEVICE);
		release_class(pid, CUDA_MEM_HOST);
	}

	struct gpumem_event *e = reserve_header();
	if (!e)
		return 0;
	e->type = GPUMEM_EVENT_EXIT;
	e->op = 0;
	e->result = 0;
	e->timestamp = bpf_ktime_get_ns();
	gadget_process_populate(&e->proc);
	e->address = 0;
	e->bytes = 0;
	e->ustack_len = 0;
	e->pystack_len = 0;
	e->stack_flags = 0;
	e->device = GPUMEM_DEVICE_UNKNOWN;
	submit(e);
	if (aggregate)
		forget_process(pid);
	return 0;
}

/* enter_op reads the arguments of driver function op, or reports it at
 * once when it is a free. Every traced function takes its pointer, context
 * or out-parameter first; allocations take their size second. */
static __always_inline int enter_op(struct pt_regs *ctx, __u16 op, bool stock_ig)
{
	__u64 target = PT_REGS_PARM1(ctx);
	__u32 pid = bpf_get_current_pid_tgid() >> 32;

	if (filtered_out(pid))
		return 0;
	/* A free is sent at its entry; one of a null pointer frees nothing
	 * (XLA, NCCL and PyTorch make them). */
	if (gpumem_op_is_free(op))
		return target ? report_address(op, target, stock_ig) : 0;
	switch (op) {
	case GPUMEM_OP_MEM_ALLOC_PITCH:
		/* (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) */
		return enter(op, target, PT_REGS_PARM4(ctx), PT_REGS_PARM2(ctx));
	case GPUMEM_OP_MEM_RETAIN_ALLOCATION_HANDLE: /* (handle, addr) */
		return enter(op, target, 0, 0);
	case GPUMEM_OP_MEM_CREATE:
		/* (handle, size, prop, flags) */
		return enter(op, target, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx));
	case GPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN: /* (pctx, dev) */
		return enter(op, target, PT_REGS_PARM2(ctx), 0);
	case GPUMEM_OP_CTX_CREATE: /* (pctx, flags, dev) */
		return enter(op, target, PT_REGS_PARM3(ctx), 0);
	case GPUMEM_OP_CTX_CREATE_V3: /* (pctx, paramsArray, numParams, flags, dev) */
		return enter(op, target, PT_REGS_PARM5(ctx), 0);
	case GPUMEM_OP_CTX_CREATE_V4: /* (pctx, ctxCreateParams, flags, dev) */
		return enter(op, target, PT_REGS_PARM4(ctx), 0);
	}
	/* A module load's (pmod, image...), an unload's (hmod): no size. */
	if (gpumem_op_is_context(op) || gpumem_op_is_module(op))
		return enter(op, target, 0, 0);
	return enter(op, target, PT_REGS_PARM2(ctx), 0);
}

/* driver_view_off says whether process pid's driver view is switched off,
 * and counts the call as not traced if so: each call is either reported or
 * counted, once. */
static __always_inline bool driver_view_off(__u32 pid)
{
	__u64 *skipped = bpf_map_lookup_elem(&driver_off, &pid);
	if (!skipped)
		return false;
	__sync_fetch_and_add(skipped, 1);
	return true;
}

/* The entry program for every driver function and the return program for
 * every one but the frees, attached by gpumem with uprobe_multi links: the
 * attach cookie is the function's enum gpumem_op. One link per library
 * keeps attach and detach to one RCU grace period each, where a perf-event
 * uprobe per function costs 0.1s apiece to detach. */
SEC("uprobe.multi/libcuda")
int gpumem_enter(struct pt_regs *ctx)
{
	if (driver_view_off(bpf_get_current_pid_tgid() >> 32))
		return 0;
	return enter_op(ctx, bpf_get_attach_cookie(ctx), false);
}

SEC("uretprobe.multi/libcuda")
int gpumem_leave(struct pt_regs *ctx)
{
	/* Without the in-kernel totals, which gpumem does not use: their stack
	 * capture tail-calls through IG's program array, and the kernel lets
	 * programs of one attach type only (uprobe, not uprobe_multi) share it. */
	__u64 id = bpf_get_current_pid_tgid();
	struct gpumem_call *call = pop_call(id);
	if (!call)
		return 0;
	/* Entered before the switch-off: not reported after it, so that the
	 * books user space closed then stay closed; counted instead. */
	if (driver_view_off(id >> 32))
		return 0;
	__u64 made = 0; /* a context made or a module loaded: reported as an allocation is */
	if (gpumem_op_is_context(call->op)) {
		made = PT_REGS_RC(ctx) == 0 ? context_made(call) : 0;
		if (call->op == GPUMEM_OP_CTX_DESTROY && PT_REGS_RC(ctx) == 0)
			report_address(call->op, call->target, false);
		leave_context(ctx, call, id);
		if (!made)
			return 0;
	} else if (gpumem_op_is_module(call->op)) {
		made = module_loaded(ctx, call);
		if (!made)
			return 0;
	}
	if (call->op == GPUMEM_OP_MEM_RETAIN_ALLOCATION_HANDLE)
		return report_retain(ctx, call);
	struct gpumem_event *e = hold_scratch();
	if (!e)
		return 0;
	report_allocation(ctx, e, call, false, made);
	release_scratch();
	return 0;
}

/* PyTorch's caching allocator, from its USDT probes: a tensor allocated
 * or freed inside segments the driver handed out earlier. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GPUMEM_MAX_USDT_SITES);
	__type(key, __u32);
	__type(value, struct gpumem_usdt_site);
} usdt_sites SEC(".maps");

/* With tensor_native_stacks off, a tensor allocated from Python keeps the
 * allocator's frame and its Python frames: the native frames between them
 * (ATen, the Python bindings) cost a read each on every tensor. A tensor
 * without Python frames (autograd's threads) keeps its whole native stack. */
const volatile bool tensor_native_stacks = false;

/* probe_register reads the register at offset off of struct pt_regs (usdt
 * package's) from the context itself: a load, where a helper call to read
 * the context at a variable offset costs tens of ns. False for an offset
 * of no register. */
static __always_inline bool probe_register(struct pt_regs *ctx, __u16 off, __u64 *v)
{
	switch (off) {
#if defined(__TARGET_ARCH_x86)
	case offsetof(struct pt_regs, r15): *v = ctx->r15; return true;
	case offsetof(struct pt_regs, r14): *v = ctx->r14; return true;
	case offsetof(struct pt_regs, r13): *v = ctx->r13; return true;
	case offsetof(struct pt_regs, r12): *v = ctx->r12; return true;
	case offsetof(struct pt_regs, bp): *v = ctx->bp; return true;
	case offsetof(struct pt_regs, bx): *v = ctx->bx; return true;
	case offsetof(struct pt_regs, r11): *v = ctx->r11; return true;
	case offsetof(struct pt_regs, r10): *v = ctx->r10; return true;
	case offsetof(struct pt_regs, r9): *v = ctx->r9; return true;
	case offsetof(struct pt_regs, r8): *v = ctx->r8; return true;
	case offsetof(struct pt_regs, ax): *v = ctx->ax; return true;
	case offsetof(struct pt_regs, cx): *v = ctx->cx; return true;
	case offsetof(struct pt_regs, dx): *v = ctx->dx; return true;
	case offsetof(struct pt_regs, si): *v = ctx->si; return true;
	case offsetof(struct pt_regs, di): *v = ctx->di; return true;
	case offsetof(struct pt_regs, ip): *v = ctx->ip; return true;
	case offsetof(struct pt_regs, sp): *v = ctx->sp; return true;
#endif
	}
	return bpf_probe_read_kernel(v, sizeof(*v), (void *)ctx + (off & 0xff)) == 0;
}

/* usdt_arg reads one argument at the probe into *v, as libbpf's
 * usdt.bpf.h does: eight bytes, cut to the argument's size with its sign.
 * False, counted, when it cannot be read. */
static __always_inline bool usdt_arg(struct pt_regs *ctx, const struct gpumem_usdt_arg *a, __u64 *v)
{
	*v = 0;
	if (a->kind == GPUMEM_USDT_CONSTANT)
		*v = a->value;
	else if (!probe_register(ctx, a->reg, v))
		goto unreadable;
	if (a->kind == GPUMEM_USDT_MEMORY && bpf_probe_read_user(v, sizeof(*v), (void *)(*v + a->value)))
		goto unreadable;
	__u32 shift = 64 - 8 * (a->size & 15);
	if (shift >= 64)
		return true;
	*v <<= shift;
	*v = a->is_signed ? (__u64)((__s64)*v >> shift) : *v >> shift;
	return true;
unreadable:
	count_loss(GPUMEM_LOSS_TENSOR_ARG);
	return false;
}

/* report_tensor fills e from a tensor allocation probe's arguments; false
 * when one cannot be read, which would enter a tensor at address 0. */
static __always_inline bool report_tensor(struct pt_regs *ctx, struct gpumem_event *e, const struct gpumem_usdt_site *s,
					  struct sent_stack *sent)
{
	begin_header(e, s->op, 0);
	e->timestamp = bpf_ktime_get_ns();
	e->bytes = 0;
	if (!usdt_arg(ctx, &s->args[0], &e->address))
		return false;
	__u64 device;
	if (!usdt_arg(ctx, &s->args[1], &device) || !usdt_arg(ctx, &s->args[2], &e->bytes))
		return false;
	e->device = (__s32)device;
	capture_allocation(ctx, e, tensor_native_stacks, sent);
	return true;
}


SEC("uprobe.multi/libc10_cuda")
int gpumem_tensor(struct pt_regs *ctx)
{
	__u32 site = bpf_get_attach_cookie(ctx);
	__u32 pid = bpf_get_current_pid_tgid() >> 32;

	if (filtered_out(pid))
		return 0;
	struct gpumem_usdt_site *s = bpf_map_lookup_elem(&usdt_sites, &site);
	if (!s)
		return 0;
	if (s->op == GPUMEM_OP_TENSOR_FREE) {
		/* No stack: sent straight from the ring buffer, as a driver free is. */
		__u64 address;
		return usdt_arg(ctx, &s->args[0], &address) ? report_tensor_free(address) : 0;
	}
	struct gpumem_event *e = hold_scratch();
	if (!e)
		return 0;
	struct sent_stack sent = {};
	if (report_tensor(ctx, e, s, &sent) && output(e, event_size(e)) && sent.way)
		*sent.way = sent.hash;
	release_scratch();
	return 0;
}

/* PyTorch's allocator, its own functions: what changes its books without
 * passing pytorch:malloc or pytorch:free (docs/pytorch-allocator-books.md).
 *
 * CUDA graph pools: PyTorch's checkpoint restore. Inductor's graph trees
 * put a private pool back to a checkpoint through
 * NativeCachingAllocator::setCheckpointPoolState, which frees and
 * re-creates blocks inside the allocator without passing pytorch:malloc or
 * pytorch:free (docs/pytorch-allocator-books.md). Its entry keeps where the
 * result goes and the checkpoint; its return reports the same changes to
 * the books, in the same order: a tensor free per pointer the restore
 * freed, then, segment by segment, a tensor allocation of every block of
 * the checkpoint (its block size, as torch counts it) and a free of those
 * not live in it. The allocations carry the restore's stack. */
enum gpumem_allocator_function {
	GPUMEM_FN_RESTORE = 1, /* setCheckpointPoolState */
	GPUMEM_FN_RAW_ALLOC,   /* raw_alloc, raw_alloc_with_stream */
};

struct gpumem_allocator_call {
	/* A restore's CheckpointDelta* (the result's hidden pointer) and
	 * PrivatePoolState* (the shared_ptr's object); raw_alloc's bytes. */
	__u64 args[2];
	__s32 device;
	__u32 fn; /* enum gpumem_allocator_function */
};

/* An LRU map: a call that threw (out of memory, a failed check) never
 * returns, and its entry, left behind, makes room for others. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024); /* threads in one of these calls at once */
	__type(key, __u64);        /* pid_tgid */
	__type(value, struct gpumem_allocator_call);
} allocator_calls SEC(".maps");

/* enter_allocator_call keeps a call's arguments for its return; false,
 * counted, when they cannot be kept. */
static __always_inline bool enter_allocator_call(struct gpumem_allocator_call *c)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;

	if (filtered_out(pid))
		return false;
	if (bpf_map_update_elem(&allocator_calls, &id, c, BPF_ANY)) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return false;
	}
	return true;
}

/* leave_allocator_call takes the call's arguments back at the return of
 * function fn; false when its entry was not kept (or is another function's,
 * left by a call that threw). */
static __always_inline bool leave_allocator_call(struct gpumem_allocator_call *c, __u32 fn)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct gpumem_allocator_call *p = bpf_map_lookup_elem(&allocator_calls, &id);
	if (!p)
		return false;
	*c = *p;
	bpf_map_delete_elem(&allocator_calls, &id);
	return c->fn == fn;
}

SEC("uprobe.multi/libc10_cuda")
int gpumem_restore_enter(struct pt_regs *ctx)
{
	/* x86-64: the result's pointer, this, the device, the shared_ptr's address. */
	struct gpumem_allocator_call c = {.args = {PT_REGS_PARM1(ctx)}, .device = (__s8)PT_REGS_PARM3(ctx), .fn = GPUMEM_FN_RESTORE};
	if (bpf_probe_read_user(&c.args[1], sizeof(c.args[1]), (void *)PT_REGS_PARM4(ctx))) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 0;
	}
	enter_allocator_call(&c);
	return 0;
}

/* read_vector reads a std::vector's begin and end at addr: its length in
 * elements of size, NULL begin when unreadable or past GPUMEM_MAX_RESTORED
 * (counted). */
static __always_inline __u64 read_vector(__u64 addr, __u32 size, __u64 *begin)
{
	__u64 v[2];
	*begin = 0;
	if (bpf_probe_read_user(v, sizeof(v), (void *)addr) || v[1] < v[0]) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 0;
	}
	__u64 n = (v[1] - v[0]) / size;
	if (n > GPUMEM_MAX_RESTORED) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 0;
	}
	*begin = v[0];
	return n;
}

struct restore_walk {
	__u64 begin;  /* the vector walked */
	__u64 blocks; /* restore_block's: the segment's first BlockState */
	bool live_only; /* restore_block's second pass: frees of the blocks not live */
};

static long restore_freed(__u64 i, void *arg)
{
	struct restore_walk *w = arg;
	__u64 ptr;
	if (bpf_probe_read_user(&ptr, sizeof(ptr), (void *)(w->begin + i * sizeof(ptr)))) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 1;
	}
	report_tensor_free(ptr);
	return 0;
}

/* restore_block: first pass, block i of the segment allocated again, from
 * the scratch event its caller filled with the restore's stack; second
 * pass, freed again unless live in the checkpoint. */
static long restore_block(__u64 i, void *arg)
{
	struct restore_walk *w = arg;
	struct {
		__u64 size, ptr;
		__u8 allocated;
	} b;
	_Static_assert(GPUMEM_CKPT_BLOCK_PTR == GPUMEM_CKPT_BLOCK_BYTES + 8 &&
			       GPUMEM_CKPT_BLOCK_ALLOCATED == GPUMEM_CKPT_BLOCK_PTR + 8,
		       "BlockState's size, ptr and allocated follow each other");
	if (bpf_probe_read_user(&b, 17, (void *)(w->blocks + i * GPUMEM_CKPT_BLOCK_SIZE + GPUMEM_CKPT_BLOCK_BYTES))) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 1;
	}
	if (w->live_only) {
		if (!b.allocated)
			report_tensor_free(b.ptr);
		return 0;
	}
	__u32 zero = 0;
	struct gpumem_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 1;
	e->address = b.ptr;
	e->bytes = b.size;
	e->timestamp = bpf_ktime_get_ns();
	output(e, event_size(e));
	return 0;
}

static long restore_segment(__u64 i, void *arg)
{
	struct restore_walk *w = arg;
	struct restore_walk blocks = {};
	__u64 n = read_vector(w->begin + i * GPUMEM_CKPT_SEGMENT_SIZE, GPUMEM_CKPT_BLOCK_SIZE, &blocks.blocks);
	if (!blocks.blocks)
		return 1;
	bpf_loop(n, restore_block, &blocks, 0);
	blocks.live_only = true;
	bpf_loop(n, restore_block, &blocks, 0);
	return 0;
}

/* NativeCachingAllocator::raw_alloc(size_t nbytes) and
 * raw_alloc_with_stream(size_t nbytes, cudaStream_t) hand out a block
 * without pytorch:malloc (torch.cuda.caching_allocator_alloc, libraries'
 * scratch): a tensor allocation on the calling thread's current device, as
 * torch's own device guard picks it, charged to the caller's stack. */
SEC("uprobe.multi/libc10_cuda")
int gpumem_raw_alloc_enter(struct pt_regs *ctx)
{
	struct gpumem_allocator_call c = {.args = {PT_REGS_PARM2(ctx)}, .fn = GPUMEM_FN_RAW_ALLOC}; /* after this */
	enter_allocator_call(&c);
	return 0;
}

SEC("uprobe.multi/libc10_cuda") /* at its return instructions */
int gpumem_raw_alloc_return(struct pt_regs *ctx)
{
	struct gpumem_allocator_call c;
	__u64 ptr = PT_REGS_RC(ctx);
	if (!leave_allocator_call(&c, GPUMEM_FN_RAW_ALLOC) || !ptr)
		return 0;
	struct gpumem_event *e = hold_scratch();
	if (!e)
		return 0;
	begin_header(e, GPUMEM_OP_TENSOR_ALLOC, 0);
	e->timestamp = bpf_ktime_get_ns();
	e->address = ptr;
	e->bytes = c.args[0];
	struct gpumem_call call = {.op = GPUMEM_OP_TENSOR_ALLOC};
	e->device = current_device(&call, e->proc.tid);
	capture_allocation(ctx, e, tensor_native_stacks, NULL);
	output(e, event_size(e));
	release_scratch();
	return 0;
}

/* NativeCachingAllocator::raw_delete(void *ptr) frees a block without
 * pytorch:free: graph trees free so the dead tensors' blocks a restore
 * made live again (and torch.cuda.caching_allocator_delete). A tensor
 * free, as the USDT site's. */
SEC("uprobe.multi/libc10_cuda")
int gpumem_raw_delete(struct pt_regs *ctx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;

	if (filtered_out(pid))
		return 0;
	return report_tensor_free(PT_REGS_PARM2(ctx)); /* after this */
}

/* NativeCachingAllocator::beginAllocateToPool(device, MempoolId_t,
 * filter): the calling thread allocates to a private pool until
 * endAllocateToPool. The filter (the capture's stream, or the thread, as
 * graph trees and use_mem_pool give it) is not read: the thread stands for
 * it. */
SEC("uprobe.multi/libc10_cuda")
int gpumem_pool_begin(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 one = 1;

	if (filtered_out(id >> 32))
		return 0;
	__u32 *depth = bpf_map_lookup_elem(&pool_threads, &id);
	if (depth)
		(*depth)++; /* the thread's own entry: no other writer */
	else if (bpf_map_update_elem(&pool_threads, &id, &one, BPF_ANY))
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
	else
		count_pool_threads(1);
	return 0;
}

/* NativeCachingAllocator::endAllocateToPool(device, MempoolId_t). */
SEC("uprobe.multi/libc10_cuda")
int gpumem_pool_end(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 *depth = bpf_map_lookup_elem(&pool_threads, &id);

	if (!depth)
		return 0;
	if (*depth > 1)
		(*depth)--;
	else if (bpf_map_delete_elem(&pool_threads, &id) == 0)
		count_pool_threads(-1);
	return 0;
}

/* At each of its return instructions (not a return probe: see
 * allocatorFunction in tracer). */
SEC("uprobe.multi/libc10_cuda")
int gpumem_restore_return(struct pt_regs *ctx)
{
	struct gpumem_allocator_call r;
	if (!leave_allocator_call(&r, GPUMEM_FN_RESTORE))
		return 0;

	struct restore_walk w = {};
	__u64 n = read_vector(r.args[0] + GPUMEM_CKPT_DELTA_FREED, sizeof(__u64), &w.begin);
	if (w.begin)
		bpf_loop(n, restore_freed, &w, 0);

	n = read_vector(r.args[1] + GPUMEM_CKPT_STATE_SEGMENTS, GPUMEM_CKPT_SEGMENT_SIZE, &w.begin);
	if (!w.begin || !n)
		return 0;
	struct gpumem_event *e = hold_scratch();
	if (!e) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 0;
	}
	begin_header(e, GPUMEM_OP_TENSOR_ALLOC, 0);
	e->device = r.device;
	capture_allocation(ctx, e, tensor_native_stacks, NULL);
	e->stack_flags |= GPUMEM_GRAPH_POOL; /* a checkpoint is of a graph's pool */
	bpf_loop(n, restore_segment, &w, 0);
	release_scratch();
	return 0;
}

/* The same probes, one program per function, for stock IG's uprobe attach
 * (it takes one library:symbol per program). The op is fixed at compile time
 * where gpumem_enter reads it from the attach cookie; IG's filters (mount
 * namespace, --pid, --comm) apply at entry: a call not entered is not
 * reported.
 *
 * The allocations' return programs hand the call to one program,
 * gpumem_finish, through a tail call: the Python frame walk and the stack
 * capture are then checked by the verifier once, not once per function. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gpumem_call);
} finishing SEC(".maps");

/* gadget.yaml leaves it unattached: only the tail call runs it, with the
 * scratch held by leave_allocation. */
SEC("kprobe/gpumem_finish")
int gpumem_finish(struct pt_regs *ctx)
{
	__u32 zero = 0;
	struct gpumem_call *call = bpf_map_lookup_elem(&finishing, &zero);
	struct gpumem_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (call && e)
		report_allocation(ctx, e, call, true, 0);
	release_scratch();
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, int(struct pt_regs *));
} finish_allocations SEC(".maps") = {
	.values = {[0] = (void *)&gpumem_finish},
};

static __always_inline int leave_allocation(struct pt_regs *ctx)
{
	__u32 zero = 0;
	struct gpumem_call *call = pop_call(bpf_get_current_pid_tgid());
	struct gpumem_call *next = bpf_map_lookup_elem(&finishing, &zero);
	if (!call || !next || !hold_scratch()) /* finishing is scratch too */
		return 0;
	*next = *call;
	bpf_tail_call(ctx, &finish_allocations, 0);
	release_scratch();
	count_loss(GPUMEM_LOSS_UNFINISHED); /* the program array was left empty */
	return 0;
}

#define GPUMEM_ENTRY(symbol, op)                                    \
	SEC("uprobe/libcuda:" #symbol)                              \
	int gpumem_enter_##symbol(struct pt_regs *ctx)             \
	{                                                           \
		if (gadget_should_discard_data_current())           \
			return 0;                                   \
		return enter_op(ctx, op, true);                     \
	}

#define GPUMEM_ALLOCATION_PROBE(symbol, op)                         \
	GPUMEM_ENTRY(symbol, op)                                    \
	SEC("uretprobe/libcuda:" #symbol)                           \
	int gpumem_leave_##symbol(struct pt_regs *ctx)             \
	{                                                           \
		return leave_allocation(ctx);                       \
	}

#define GPUMEM_CONTEXT_PROBE(symbol, op)                            \
	GPUMEM_ENTRY(symbol, op)                                    \
	SEC("uretprobe/libcuda:" #symbol)                           \
	int gpumem_leave_##symbol(struct pt_regs *ctx)             \
	{                                                           \
		__u64 id = bpf_get_current_pid_tgid();              \
		struct gpumem_call *call = pop_call(id);            \
		return call ? leave_context(ctx, call, id) : 0;     \
	}

/* Frees are reported at their entry: no return program. */
#define GPUMEM_FREE_PROBE(symbol, op) GPUMEM_ENTRY(symbol, op)

GPUMEM_ALLOCATION_PROBE(cuMemAlloc_v2, GPUMEM_OP_MEM_ALLOC)
GPUMEM_ALLOCATION_PROBE(cuMemAllocPitch_v2, GPUMEM_OP_MEM_ALLOC_PITCH)
GPUMEM_ALLOCATION_PROBE(cuMemAllocManaged, GPUMEM_OP_MEM_ALLOC_MANAGED)
GPUMEM_ALLOCATION_PROBE(cuMemAllocHost_v2, GPUMEM_OP_MEM_ALLOC_HOST)
GPUMEM_ALLOCATION_PROBE(cuMemHostAlloc, GPUMEM_OP_MEM_HOST_ALLOC)
GPUMEM_ALLOCATION_PROBE(cuMemAllocAsync, GPUMEM_OP_MEM_ALLOC_ASYNC)
GPUMEM_ALLOCATION_PROBE(cuMemAllocAsync_ptsz, GPUMEM_OP_MEM_ALLOC_ASYNC_PTSZ)
GPUMEM_ALLOCATION_PROBE(cuMemAllocFromPoolAsync, GPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC)
GPUMEM_ALLOCATION_PROBE(cuMemAllocFromPoolAsync_ptsz, GPUMEM_OP_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ)
GPUMEM_ALLOCATION_PROBE(cuMemCreate, GPUMEM_OP_MEM_CREATE)
GPUMEM_FREE_PROBE(cuMemFree_v2, GPUMEM_OP_MEM_FREE)
GPUMEM_FREE_PROBE(cuMemFreeHost, GPUMEM_OP_MEM_FREE_HOST)
GPUMEM_FREE_PROBE(cuMemFreeAsync, GPUMEM_OP_MEM_FREE_ASYNC)
GPUMEM_FREE_PROBE(cuMemFreeAsync_ptsz, GPUMEM_OP_MEM_FREE_ASYNC_PTSZ)
GPUMEM_FREE_PROBE(cuMemRelease, GPUMEM_OP_MEM_RELEASE)
GPUMEM_CONTEXT_PROBE(cuCtxSetCurrent, GPUMEM_OP_CTX_SET_CURRENT)
GPUMEM_CONTEXT_PROBE(cuCtxPushCurrent_v2, GPUMEM_OP_CTX_PUSH_CURRENT)
GPUMEM_CONTEXT_PROBE(cuCtxPopCurrent_v2, GPUMEM_OP_CTX_POP_CURRENT)
GPUMEM_CONTEXT_PROBE(cuDevicePrimaryCtxRetain, GPUMEM_OP_DEVICE_PRIMARY_CTX_RETAIN)
GPUMEM_CONTEXT_PROBE(cuCtxCreate_v2, GPUMEM_OP_CTX_CREATE)
GPUMEM_CONTEXT_PROBE(cuCtxCreate_v3, GPUMEM_OP_CTX_CREATE_V3)
GPUMEM_CONTEXT_PROBE(cuCtxCreate_v4, GPUMEM_OP_CTX_CREATE_V4)
GPUMEM_CONTEXT_PROBE(cuCtxDestroy_v2, GPUMEM_OP_CTX_DESTROY)

char LICENSE[] SEC("license") = "Dual BSD/GPL";
