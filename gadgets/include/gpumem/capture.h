/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* An allocation's stacks, Python and native, and the mark that has its
 * process's exit reported. */
#ifndef GPUMEM_CAPTURE_H
#define GPUMEM_CAPTURE_H

#include "python.h"
#include "sent_stacks.h"
#include "unwind.h"
#include "pool.h"
#include "output.h"

/* Processes that allocated through the driver: only their exit is reported. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, __u32);
	__type(value, __u8);
} traced_pids SEC(".maps");

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

#endif
