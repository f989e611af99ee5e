/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Python stacks named by their hash once a thread sent them whole. */
#ifndef GPUMEM_SENT_STACKS_H
#define GPUMEM_SENT_STACKS_H

#include "python.h"

/* python_stack_hash hashes e's Python frames, every field user space reads,
 * never 0 (an empty slot of python_thread.sent). Two multiplicative lanes,
 * so that a frame costs about four cycles, not eight: 64 bits, two stacks
 * of a thread collide about once in 2^64 pairs. tracer's pyStackHash is
 * the same function. */
#define GPUMEM_PY_HASH_CODE 0x9e3779b97f4a7c15ULL
#define GPUMEM_PY_HASH_REST 0xc2b2ae3d27d4eb4fULL

static __always_inline __u64 python_stack_hash(const struct gpumem_event *e)
{
	__u64 code = GPUMEM_PY_HASH_CODE, rest = GPUMEM_PY_HASH_REST;
	__u32 n = e->pystack_len;
	for (__u32 i = 0; i < GPUMEM_MAX_PY_FRAMES && i < n; i++) {
		const struct gpumem_pyframe *f = &e->pystack[i];
		code = (code ^ f->code ^ (f->cls << 32 | f->cls >> 32)) * GPUMEM_PY_HASH_CODE;
		rest = (rest ^ f->instr ^ (__u64)f->flags << 56) * GPUMEM_PY_HASH_REST;
	}
	__u64 h = code ^ (rest << 32 | rest >> 32) ^ n;
	h = (h ^ h >> 31) * GPUMEM_PY_HASH_CODE;
	return (h ^ h >> 29) | 1;
}

/* A hash to enter into a thread's table once its event is sent whole. */
struct sent_stack {
	__u64 *way;
	__u64 hash;
};

/* name_sent_stack puts in e, in place of its Python frames, their hash when
 * t's thread sent them whole before; else it says in *sent where their
 * hash goes once this event is sent. Stacks of one frame are sent as they
 * are: a frame is as long as the hash's entry. */
static __always_inline void name_sent_stack(struct gpumem_event *e, struct python_thread *t, struct sent_stack *sent)
{
	if (!t || e->pystack_len < 2)
		return;
	__u64 h = python_stack_hash(e);
	__u32 set = (h & (GPUMEM_PY_SENT_SETS - 1)) * 2;
	__u64 *ways = &t->sent[set];
	if (ways[0] == h || ways[1] == h) {
		e->pystack[0] = (struct gpumem_pyframe){.code = h, .instr = e->pystack_len};
		e->pystack_len = 1;
		e->stack_flags |= GPUMEM_PY_SENT_BEFORE;
		return;
	}
	/* An empty way first, so that two stacks of a set both stay. */
	sent->way = !ways[0] ? &ways[0] : !ways[1] ? &ways[1] : &ways[(h >> 32) & 1];
	sent->hash = h;
}

#endif
