/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The native user stack, by its frame pointers. */
#ifndef GPUMEM_UNWIND_H
#define GPUMEM_UNWIND_H

#include "../gpumem.h"
#include "output.h"

/* native_frames is where an event's native stack lies: right after its
 * Python frames. */
static __always_inline __u64 *native_frames(struct gpumem_event *e)
{
	__u32 py = e->pystack_len;
	if (py > GPUMEM_MAX_PY_FRAMES)
		py = GPUMEM_MAX_PY_FRAMES;
	return (__u64 *)&e->pystack[py];
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
	__u64 *frames = native_frames(e);
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

/* caller_first puts a stack captured at a function's entry right: there,
 * before its prologue, the frame pointer is still its caller's, so the walk
 * began at its caller's caller; the caller is the return address on top of
 * the stack, in place of the probed instruction. */
static __always_inline void caller_first(struct pt_regs *ctx, struct gpumem_event *e)
{
	if (e->ustack_len > 0 && bpf_probe_read_user(native_frames(e), sizeof(__u64), (void *)PT_REGS_SP(ctx)))
		count_loss(GPUMEM_LOSS_STACK_UNAVAILABLE);
}

#endif
