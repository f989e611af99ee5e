/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The threads allocating to a private pool of PyTorch's allocator (CUDA
 * graphs). */
#ifndef GPUMEM_POOL_H
#define GPUMEM_POOL_H

/* Threads allocating to a private pool of PyTorch's allocator: between
 * NativeCachingAllocator::beginAllocateToPool and endAllocateToPool (a
 * CUDA graph's capture, graph trees' warm-up and recording,
 * torch.cuda.use_mem_pool), the allocations they make, segments and
 * tensors, belong to the pool (docs/pytorch-allocator-books.md). The
 * count of pools the thread has begun and not ended. An LRU map: a thread
 * that never ends (an exception between the two) makes room for others. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024); /* threads allocating to a pool at once */
	__type(key, __u64);        /* pid_tgid */
	__type(value, __u32);
} pool_threads SEC(".maps");

/* How many threads pool_threads holds: while none, an allocation skips its
 * lookup there (an array's lookup is a load; a hash's, a hash). An entry
 * the LRU map drops leaves it high: lookups that find nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} pool_thread_count SEC(".maps");

/* in_pool says whether the thread of process pid, thread tid allocates to
 * a private pool. */
static __always_inline bool in_pool(__u32 pid, __u32 tid)
{
	__u32 zero = 0;
	__u64 *threads = bpf_map_lookup_elem(&pool_thread_count, &zero);
	if (!threads || *threads == 0)
		return false;
	__u64 id = (__u64)pid << 32 | tid;
	return bpf_map_lookup_elem(&pool_threads, &id) != NULL;
}

static __always_inline void count_pool_threads(__s64 by)
{
	__u32 zero = 0;
	__u64 *threads = bpf_map_lookup_elem(&pool_thread_count, &zero);
	if (threads)
		__sync_fetch_and_add(threads, by);
}

#endif
