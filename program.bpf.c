// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* gpu-mem: charge every GPU allocation made through the CUDA driver library
 * (libcuda.so.1) to the user call stack that made it.
 *
 * Entry probes remember each call's arguments per thread; return probes read
 * the driver's result and out-parameters and send one event per call through
 * the ring buffer. User space keeps the ledger (pointer -> bytes, stack), so
 * a free releases exactly what its allocation charged. Every event that
 * cannot be delivered whole is counted: in `losses`, and events dropped by a
 * full ring buffer in `events_lost_samples` (IG's convention).
 */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include <gadget/buffer.h>
#include <gadget/macros.h>
#include <gadget/types.h>

#include "gadgets/include/gpumem.h"

/* Calls in flight, keyed by pid_tgid. An entry outlives its call only when
 * the thread dies inside the driver; the exit hook below removes it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct gpumem_call);
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

/* Put the enums user space needs into BTF for the generated Go bindings, the
 * way IG's GADGET_TRACER anchors its event type. */
const enum gpumem_event_type *gpumem_event_type_btf __attribute__((unused));
const enum gpumem_loss *gpumem_loss_btf __attribute__((unused));
const enum gpumem_op *gpumem_op_btf __attribute__((unused));


GADGET_TRACER_MAP(events, GPUMEM_RINGBUF_BYTES);
GADGET_TRACER(cuda, events, gpumem_event);

static __always_inline void count_loss(__u32 loss)
{
	__u64 *n = bpf_map_lookup_elem(&losses, &loss);
	if (n)
		*n += 1;
}

static __always_inline int enter(__u16 op, __u64 target, __u64 bytes, __u64 pitch_out)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;

	if (filter_pids && !bpf_map_lookup_elem(&target_pids, &pid))
		return 0;

	struct gpumem_call call = {
		.timestamp = bpf_ktime_get_ns(),
		.target = target,
		.bytes = bytes,
		.pitch_out = pitch_out,
		.op = op,
	};
	if (bpf_map_update_elem(&inflight, &id, &call, BPF_ANY))
		count_loss(GPUMEM_LOSS_INFLIGHT_FULL);
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
		if (bpf_probe_read_user(&pitch, sizeof(pitch), (void *)call->pitch_out)) {
			count_loss(GPUMEM_LOSS_READ_RESULT);
			return false;
		}
		e->bytes = pitch * call->bytes; /* bytes holds the height */
	}
	return true;
}

static __always_inline __u32 capture_stack(struct pt_regs *ctx, struct gpumem_event *e)
{
	long n = bpf_get_stack(ctx, e->ustack, sizeof(e->ustack), BPF_F_USER_STACK);
	if (n <= 0) {
		count_loss(GPUMEM_LOSS_STACK);
		return 0;
	}
	return (__u32)n / sizeof(e->ustack[0]);
}

/* leave turns the call in flight into an event. Allocations are stamped at
 * their return (when the pointer became valid) and frees at their entry
 * (before the driver could hand the pointer out again), so user space can
 * order a free and a reuse of the same pointer racing on two threads. */
static __always_inline int leave(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 zero = 0;

	struct gpumem_call *call = bpf_map_lookup_elem(&inflight, &id);
	if (!call)
		return 0; /* filtered out, or attached while the call was running */

	struct gpumem_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		goto out;

	e->type = GPUMEM_EVENT_CALL;
	e->op = call->op;
	e->result = (__s32)PT_REGS_RC(ctx);
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->ustack_len = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));

	if (gpumem_op_is_free(call->op)) {
		e->timestamp = call->timestamp;
		e->address = call->target;
		e->bytes = 0;
	} else {
		e->timestamp = bpf_ktime_get_ns();
		e->address = 0;
		e->bytes = call->bytes;
		if (e->result == 0 && !finish_allocation(e, call))
			goto out;
		e->ustack_len = capture_stack(ctx, e);
		__u8 one = 1;
		if (bpf_map_update_elem(&traced_pids, &e->pid, &one, BPF_ANY))
			count_loss(GPUMEM_LOSS_PROCESSES_FULL);
	}

	__u64 size = offsetof(struct gpumem_event, ustack) + e->ustack_len * sizeof(e->ustack[0]);
	if (size > sizeof(*e))
		size = sizeof(*e);
	gadget_output_buf(ctx, &events, e, size);
out:
	bpf_map_delete_elem(&inflight, &id);
	return 0;
}

/* Thread exit: drop a call the thread never returned from; on the last
 * thread of a traced process, report the exit so that user space releases
 * what the process still held. */
SEC("raw_tracepoint/sched_process_exit")
int gpumem_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u32 zero = 0;

	bpf_map_delete_elem(&inflight, &id);

	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	if (bpf_map_delete_elem(&traced_pids, &pid))
		return 0;

	struct gpumem_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	e->type = GPUMEM_EVENT_EXIT;
	e->op = 0;
	e->result = 0;
	e->timestamp = bpf_ktime_get_ns();
	e->pid = pid;
	e->tid = (__u32)id;
	e->address = 0;
	e->bytes = 0;
	e->ustack_len = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	gadget_output_buf(ctx, &events, e, offsetof(struct gpumem_event, ustack));
	return 0;
}

/* One entry and one return program for every driver function, attached
 * with uprobe_multi links: the attach cookie is the function's enum
 * gpumem_op. One link per library keeps attach and detach to one RCU grace
 * period each, where a perf-event uprobe per function costs 0.1s apiece to
 * detach. Every traced function takes its pointer (or its out-parameter)
 * first and its size second, except cuMemAllocPitch_v2. */
SEC("uprobe.multi/libcuda")
int gpumem_enter(struct pt_regs *ctx)
{
	__u16 op = bpf_get_attach_cookie(ctx);
	__u64 target = PT_REGS_PARM1(ctx);

	if (op == GPUMEM_OP_MEM_ALLOC_PITCH)
		/* (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes) */
		return enter(op, target, PT_REGS_PARM4(ctx), PT_REGS_PARM2(ctx));
	if (gpumem_op_is_free(op))
		return enter(op, target, 0, 0);
	return enter(op, target, PT_REGS_PARM2(ctx), 0);
}

SEC("uretprobe.multi/libcuda")
int gpumem_leave(struct pt_regs *ctx)
{
	return leave(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
