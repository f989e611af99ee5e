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
#include "gadgets/include/gpumem/filter.h"
#include "gadgets/include/gpumem/output.h"
#include "gadgets/include/gpumem/event.h"
#include "gadgets/include/gpumem/calls.h"
#include "gadgets/include/gpumem/aggregate.h"
#include "gadgets/include/gpumem/read.h"
#include "gadgets/include/gpumem/contexts.h"
#include "gadgets/include/gpumem/python.h"
#include "gadgets/include/gpumem/unwind.h"
#include "gadgets/include/gpumem/sent_stacks.h"
#include "gadgets/include/gpumem/pool.h"
#include "gadgets/include/gpumem/capture.h"
#include "gadgets/include/gpumem/report.h"
#include "gadgets/include/gpumem/usdt.h"
#include "gadgets/include/gpumem/allocator.h"
#include "gadgets/include/gpumem/stock_ig.h"

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

/* A tensor allocated or freed by PyTorch's caching allocator, at one of
 * its USDT probes' sites (usdt_sites: gpumem/usdt.h); the attach cookie is
 * the site's index. */
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

/* c10::reportOutOfMemoryToProfiler(int64_t alloc_size, size_t
 * total_allocated, size_t total_reserved, c10::Device device), in
 * libc10.so: PyTorch's allocator calls it before it raises out of memory,
 * whether the driver refused (its cache emptied and tried again) or a limit
 * of its own did (set_per_process_memory_fraction), which the driver never
 * sees. A failed allocation of the size asked, with the caller's stack. */
SEC("uprobe.multi/libc10")
int gpumem_tensor_oom(struct pt_regs *ctx)
{
	if (filtered_out(bpf_get_current_pid_tgid() >> 32))
		return 0;
	struct gpumem_event *e = hold_scratch();
	if (!e)
		return 0;
	begin_header(e, GPUMEM_OP_TENSOR_OOM, GPUMEM_CUDA_ERROR_OUT_OF_MEMORY);
	e->timestamp = bpf_ktime_get_ns();
	e->address = 0;
	e->bytes = PT_REGS_PARM1(ctx);
	e->device = (__s8)(PT_REGS_PARM4(ctx) >> 8); /* c10::Device: its type, then its index, one byte each */
	capture_allocation(ctx, e, true, NULL);
	caller_first(ctx, e);
	output(e, event_size(e));
	release_scratch();
	return 0;
}

/* NativeCachingAllocator::setCheckpointPoolState, a CUDA graph pool's
 * checkpoint restore (gpumem/allocator.h), at its entry. */
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

/* Stock IG's per-function programs (gpumem/stock_ig.h) finish their
 * allocations here. gadget.yaml leaves it unattached: only the tail call
 * runs it, with the scratch held by leave_allocation. */
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
