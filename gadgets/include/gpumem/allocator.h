/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* PyTorch's caching allocator: a tensor from its USDT probe's arguments,
 * and the calls of its own functions that change its books without one. */
#ifndef GPUMEM_ALLOCATOR_H
#define GPUMEM_ALLOCATOR_H

#include "usdt.h"
#include "capture.h"
#include "event.h"
#include "filter.h"
#include "output.h"
#include "report.h"

/* With tensor_native_stacks off, a tensor allocated from Python keeps the
 * allocator's frame and its Python frames: the native frames between them
 * (ATen, the Python bindings) cost a read each on every tensor. A tensor
 * without Python frames (autograd's threads) keeps its whole native stack. */
const volatile bool tensor_native_stacks = false;

/* report_tensor fills e from a tensor allocation probe's arguments; false
 * when one cannot be read, which would enter a tensor at address 0. */
static __always_inline bool report_tensor(struct pt_regs *ctx, struct gpumem_event *e, const struct gpumem_usdt_site *s,
					  struct sent_stack *sent)
{
	begin_header(e, s->op, 0);
	e->timestamp = bpf_ktime_get_ns();
	e->bytes = 0;
	if (!usdt_arg(ctx, &s->args[0], &e->address))
		return false;
	__u64 device;
	if (!usdt_arg(ctx, &s->args[1], &device) || !usdt_arg(ctx, &s->args[2], &e->bytes))
		return false;
	e->device = (__s32)device;
	capture_allocation(ctx, e, tensor_native_stacks, sent);
	if (e->pystack_len == 0) /* its thread names it (autograd's: a backward) */
		bpf_get_current_comm(e->proc.comm, sizeof(e->proc.comm));
	return true;
}

/* PyTorch's allocator, its own functions: what changes its books without
 * passing pytorch:malloc or pytorch:free (docs/pytorch-allocator-books.md).
 *
 * CUDA graph pools: PyTorch's checkpoint restore. Inductor's graph trees
 * put a private pool back to a checkpoint through
 * NativeCachingAllocator::setCheckpointPoolState, which frees and
 * re-creates blocks inside the allocator without passing pytorch:malloc or
 * pytorch:free (docs/pytorch-allocator-books.md). Its entry keeps where the
 * result goes and the checkpoint; its return reports the same changes to
 * the books, in the same order: a tensor free per pointer the restore
 * freed, then, segment by segment, a tensor allocation of every block of
 * the checkpoint (its block size, as torch counts it) and a free of those
 * not live in it. The allocations carry the restore's stack. */
enum gpumem_allocator_function {
	GPUMEM_FN_RESTORE = 1, /* setCheckpointPoolState */
	GPUMEM_FN_RAW_ALLOC,   /* raw_alloc, raw_alloc_with_stream */
};

struct gpumem_allocator_call {
	/* A restore's CheckpointDelta* (the result's hidden pointer) and
	 * PrivatePoolState* (the shared_ptr's object); raw_alloc's bytes. */
	__u64 args[2];
	__s32 device;
	__u32 fn; /* enum gpumem_allocator_function */
};

/* An LRU map: a call that threw (out of memory, a failed check) never
 * returns, and its entry, left behind, makes room for others. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024); /* threads in one of these calls at once */
	__type(key, __u64);        /* pid_tgid */
	__type(value, struct gpumem_allocator_call);
} allocator_calls SEC(".maps");

/* enter_allocator_call keeps a call's arguments for its return; false,
 * counted, when they cannot be kept. */
static __always_inline bool enter_allocator_call(struct gpumem_allocator_call *c)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;

	if (filtered_out(pid))
		return false;
	if (bpf_map_update_elem(&allocator_calls, &id, c, BPF_ANY)) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return false;
	}
	return true;
}

/* leave_allocator_call takes the call's arguments back at the return of
 * function fn; false when its entry was not kept (or is another function's,
 * left by a call that threw). */
static __always_inline bool leave_allocator_call(struct gpumem_allocator_call *c, __u32 fn)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct gpumem_allocator_call *p = bpf_map_lookup_elem(&allocator_calls, &id);
	if (!p)
		return false;
	*c = *p;
	bpf_map_delete_elem(&allocator_calls, &id);
	return c->fn == fn;
}

/* read_vector reads a std::vector's begin and end at addr: its length in
 * elements of size, NULL begin when unreadable or past GPUMEM_MAX_RESTORED
 * (counted). */
static __always_inline __u64 read_vector(__u64 addr, __u32 size, __u64 *begin)
{
	__u64 v[2];
	*begin = 0;
	if (bpf_probe_read_user(v, sizeof(v), (void *)addr) || v[1] < v[0]) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 0;
	}
	__u64 n = (v[1] - v[0]) / size;
	if (n > GPUMEM_MAX_RESTORED) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 0;
	}
	*begin = v[0];
	return n;
}

struct restore_walk {
	__u64 begin;  /* the vector walked */
	__u64 blocks; /* restore_block's: the segment's first BlockState */
	bool live_only; /* restore_block's second pass: frees of the blocks not live */
};

static long restore_freed(__u64 i, void *arg)
{
	struct restore_walk *w = arg;
	__u64 ptr;
	if (bpf_probe_read_user(&ptr, sizeof(ptr), (void *)(w->begin + i * sizeof(ptr)))) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 1;
	}
	report_tensor_free(ptr);
	return 0;
}

/* restore_block: first pass, block i of the segment allocated again, from
 * the scratch event its caller filled with the restore's stack; second
 * pass, freed again unless live in the checkpoint. */
static long restore_block(__u64 i, void *arg)
{
	struct restore_walk *w = arg;
	struct {
		__u64 size, ptr;
		__u8 allocated;
	} b;
	_Static_assert(GPUMEM_CKPT_BLOCK_PTR == GPUMEM_CKPT_BLOCK_BYTES + 8 &&
			       GPUMEM_CKPT_BLOCK_ALLOCATED == GPUMEM_CKPT_BLOCK_PTR + 8,
		       "BlockState's size, ptr and allocated follow each other");
	if (bpf_probe_read_user(&b, 17, (void *)(w->blocks + i * GPUMEM_CKPT_BLOCK_SIZE + GPUMEM_CKPT_BLOCK_BYTES))) {
		count_loss(GPUMEM_LOSS_ALLOCATOR_CALL);
		return 1;
	}
	if (w->live_only) {
		if (!b.allocated)
			report_tensor_free(b.ptr);
		return 0;
	}
	__u32 zero = 0;
	struct gpumem_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 1;
	e->address = b.ptr;
	e->bytes = b.size;
	e->timestamp = bpf_ktime_get_ns();
	output(e, event_size(e));
	return 0;
}

static long restore_segment(__u64 i, void *arg)
{
	struct restore_walk *w = arg;
	struct restore_walk blocks = {};
	__u64 n = read_vector(w->begin + i * GPUMEM_CKPT_SEGMENT_SIZE, GPUMEM_CKPT_BLOCK_SIZE, &blocks.blocks);
	if (!blocks.blocks)
		return 1;
	bpf_loop(n, restore_block, &blocks, 0);
	blocks.live_only = true;
	bpf_loop(n, restore_block, &blocks, 0);
	return 0;
}

#endif
