/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Stock IG's per-function programs: the call handed to gpumem_finish, and
 * the macros that make a program per driver function. */
#ifndef GPUMEM_STOCK_IG_H
#define GPUMEM_STOCK_IG_H

#include "../gpumem.h"

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

#endif
