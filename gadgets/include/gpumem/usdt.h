/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* USDT decoding: the PyTorch allocator's probe sites, described by user
 * space, and their arguments read as libbpf's usdt.bpf.h reads them. */
#ifndef GPUMEM_USDT_H
#define GPUMEM_USDT_H

#include "output.h"

/* PyTorch's caching allocator, from its USDT probes: a tensor allocated
 * or freed inside segments the driver handed out earlier. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GPUMEM_MAX_USDT_SITES);
	__type(key, __u32);
	__type(value, struct gpumem_usdt_site);
} usdt_sites SEC(".maps");

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

#endif
