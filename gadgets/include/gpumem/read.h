/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Reading the traced process's memory. */
#ifndef GPUMEM_READ_H
#define GPUMEM_READ_H

static __always_inline __u64 read_ptr(__u64 addr)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

#endif
