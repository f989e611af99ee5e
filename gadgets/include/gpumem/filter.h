/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Which processes are traced: gpumem --pid's filter, and the processes
 * whose driver view user space switched off. */
#ifndef GPUMEM_FILTER_H
#define GPUMEM_FILTER_H

#include "../gpumem.h"

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

#endif
