/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* An event's size and header. */
#ifndef GPUMEM_EVENT_H
#define GPUMEM_EVENT_H

#include "../gpumem.h"

static __always_inline __u64 event_size(const struct gpumem_event *e)
{
	__u64 size = offsetof(struct gpumem_event, pystack) +
		     e->pystack_len * sizeof(e->pystack[0]) + e->ustack_len * sizeof(e->ustack[0]);
	return size > sizeof(*e) ? sizeof(*e) : size;
}

/* begin_header fills the header of a call event with its process's pid
 * and tid only: the whole header of a tensor allocation with Python
 * frames, whose comm (a read of about 70 ns) user space has from the
 * process's driver calls or /proc. Only gpumem attaches the tensor probes. */
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

#endif
