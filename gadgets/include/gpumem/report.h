/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The events of driver calls: a call entered, an allocation, a free, a
 * retain, a module loaded. */
#ifndef GPUMEM_REPORT_H
#define GPUMEM_REPORT_H

#include "calls.h"
#include "contexts.h"
#include "aggregate.h"
#include "capture.h"
#include "event.h"
#include "filter.h"
#include "output.h"

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

#endif
