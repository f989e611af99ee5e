/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The CPython walker: the calling thread's Python frames, read from its
 * interpreter's thread state and frame chain. */
#ifndef GPUMEM_PYTHON_H
#define GPUMEM_PYTHON_H

#include "read.h"
#include "output.h"

/* Python processes and how to walk their interpreter, set by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUMEM_MAX_PROCESSES);
	__type(key, __u32);
	__type(value, struct gpumem_python);
} python_procs SEC(".maps");

/* The Python stacks a thread's tensor allocations sent whole, by their hash
 * (python_stack_hash): two ways of GPUMEM_PY_SENT_SETS sets, 8 KiB a
 * thread. A tensor allocation whose stack is here names it instead
 * (GPUMEM_PY_SENT_BEFORE): a training step's tensors come from the same
 * few hundred stacks over and over, and a frame not sent is 32 bytes of
 * the ring buffer not written (at depth 40 that saves about what the hash
 * costs: bench/NOTES.md). A hash enters only once its event is in the ring
 * buffer, ahead of every event that names it; user space keeps a
 * process's stacks until it exits, and a thread's table goes with the
 * thread. */
#define GPUMEM_PY_SENT_SETS 512

/* What a thread's allocations need of its process, kept with the thread:
 * task local storage, freed with it, whose lookup reads the task where
 * python_procs' and traced_pids' hashes cost about 80 ns an allocation
 * between them. */
struct python_thread {
	struct gpumem_python py; /* the process's walk, when python */
	__u64 tstate;            /* the thread's PyThreadState, checked before use; 0: not found */
	__u64 generation;        /* python_generation when python and py were read; 0: never */
	__u64 cspan;             /* the C stack's window: as far as its last walk found shims (struct stack_window) */
	__u8 python;             /* the process is in python_procs */
	__u8 traced;             /* the process is in traced_pids */
	__u64 sent[2 * GPUMEM_PY_SENT_SETS]; /* 0: empty */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct python_thread);
} python_threads SEC(".maps");

/* Bumped by user space after each change to python_procs: a thread's copy
 * read at another generation is read again. gpumem starts it at 1, so that
 * a new thread's storage (0) reads it. Under stock IG it stays 0, and so
 * does python_procs: no thread reads it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} python_generation SEC(".maps");

/* Bounds of the interpreter walks. */
#define GPUMEM_MAX_INTERPRETERS 4
#define GPUMEM_MAX_THREADS 256
/* Python frames plus the C-stack shim frames between them (3.12+). */
#define GPUMEM_MAX_PY_WALK (GPUMEM_MAX_PY_FRAMES + 32)

/* The interpreter walks run under bpf_loop, so that the verifier checks one
 * step rather than every iteration. Their state holds a copy of the
 * process's gpumem_python. */
struct find_thread {
	struct gpumem_python py;
	__u64 self;   /* the thread pointer sought */
	__u64 interp; /* interpreter being searched */
	__u64 ts;     /* next thread state to compare; 0: go to the next interpreter */
	__u64 found;
	__u32 interps;
};

static long find_thread_step(__u64 index, struct find_thread *c)
{
	if (!c->ts) {
		c->interp = c->interps == 0 ? read_ptr(c->py.runtime + c->py.runtime_interpreters_head)
					    : read_ptr(c->interp + c->py.interp_next);
		if (!c->interp || ++c->interps > GPUMEM_MAX_INTERPRETERS)
			return 1;
		c->ts = read_ptr(c->interp + c->py.interp_threads_head);
		return 0;
	}
	if (read_ptr(c->ts + c->py.tstate_thread_id) == c->self) {
		c->found = c->ts;
		return 1;
	}
	c->ts = read_ptr(c->ts + c->py.tstate_next);
	return 0;
}

/* thread_pointer is what pthread_self() returns in task. On arm64 glibc
 * it is not the thread register; Python stacks are x86-64 only. */
static __always_inline __u64 thread_pointer(struct task_struct *task)
{
#if defined(__TARGET_ARCH_x86)
	return task->thread.fsbase;
#else
	return 0;
#endif
}

/* The thread state's fields a walk reads (its frame, its thread id, its
 * data stack chunk), read at once from the first of them, the frame: they
 * lie within GPUMEM_PY_TSTATE_HEAD bytes of it in 3.10 to 3.13 (package
 * pystack refuses a layout where they do not), so that a thread state
 * costs one read of user memory instead of three. */
#define GPUMEM_PY_TSTATE_HEAD 256

/* aligned_u64 is the 8 bytes at bytes[i], in an 8-byte aligned buffer,
 * loaded at once, where the compiler, knowing only a byte's alignment,
 * would assemble them byte by byte: 8 loads and 14 shifts and ors a field.
 * The fields read so are 8-byte aligned in CPython's thread states and
 * frames, which are (package pystack refuses a layout where one is not).
 * Only the compiler is told so: the verifier and the JIT allow an
 * unaligned load on x86-64, so a frame chain that is not aligned (a
 * corrupt one) is still read as it is. Checking i's alignment instead
 * doubles the paths the verifier walks (gpumem_leave: 55% to 94% of its
 * limit). */
static __always_inline __u64 aligned_u64(const __u8 *bytes, __u64 i)
{
	return *(const __u64 *)__builtin_assume_aligned(&bytes[i], 8);
}

struct tstate_head {
	__u8 bytes[GPUMEM_PY_TSTATE_HEAD] __attribute__((aligned(8)));
	__u16 lo; /* the offset of bytes[0] in the thread state: its frame's */
};

/* read_tstate_head reads thread state ts's fields into h; false when they
 * cannot be read. */
static __always_inline bool read_tstate_head(struct tstate_head *h, const struct gpumem_python *py, __u64 ts)
{
	h->lo = py->tstate_frame;
	return bpf_probe_read_user(h->bytes, sizeof(h->bytes), (void *)(ts + py->tstate_frame)) == 0;
}

static __always_inline __u64 tstate_u64(const struct tstate_head *h, __u16 off)
{
	__u64 i = (__u16)(off - h->lo);
	if (i > sizeof(h->bytes) - 8)
		return 0;
	return aligned_u64(h->bytes, i);
}

/* find_thread_state reads the PyThreadState of the calling thread t into h,
 * found by its thread pointer: PyThreadState.thread_id is pthread_self(),
 * which on x86-64 is the fs base. The GIL holder is not used: ctypes and
 * PyTorch release the GIL around native calls. False when there is none,
 * or its fields cannot be read. */
static __always_inline bool find_thread_state(struct tstate_head *h, struct python_thread *t)
{
	__u64 self = thread_pointer(bpf_get_current_task_btf());

	if (t->tstate && read_tstate_head(h, &t->py, t->tstate) && tstate_u64(h, t->py.tstate_thread_id) == self)
		return true;
	struct find_thread c = {.py = t->py, .self = self};
	bpf_loop(GPUMEM_MAX_INTERPRETERS * (GPUMEM_MAX_THREADS + 1), find_thread_step, &c, 0);
	t->tstate = c.found;
	return c.found && read_tstate_head(h, &t->py, c.found);
}

/* A frame's first bytes, read at once: every field the walk follows lies in
 * them in 3.10 to 3.13 (3.10's f_lasti ends at 100; package pystack refuses
 * a layout where one does not), so that a frame costs one read of user
 * memory instead of four. A frame whose first bytes cannot all be read (at
 * the end of a mapping) has its first GPUMEM_PY_FRAME_MIN read, which hold
 * the fields of 3.11 to 3.13. */
#define GPUMEM_PY_FRAME_HEAD 128
#define GPUMEM_PY_FRAME_MIN 72

/* The calling thread's data stack (3.11+), read at once: the frames a walk
 * follows lie in it, one below the other, so that a walk costs one read of
 * user memory however deep. Frames outside it (generators', C-stack shims,
 * an older chunk) have their heads read one by one into its slot, past the
 * stack's bytes: every field of every frame is read from one buffer, which
 * keeps the walk's paths, and the verifier's work, few. It holds the bytes
 * from lo to the top frame's head. */
#define GPUMEM_PY_STACK_WINDOW 16384
#define GPUMEM_PY_SLOT GPUMEM_PY_STACK_WINDOW

/* The C stack's window (3.12+): shim frames live on the C stack, each
 * beside the _PyCFrame of its evaluation loop (3.12), a nested call's C
 * frames apart (550-800 bytes for a Python __call__, as nn.Module's: a
 * transformers Llama's 16 shims lie within 10 KiB; the window holds 40).
 * A walk reads the C stack once from the thread's _PyCFrame (3.11, 3.12:
 * the read of the top frame it replaces), as far above it as the thread's
 * last walk found shims; a shim inside it is passed where its callee is
 * read (pass_window_shim), one outside it is read alone. A shim read alone
 * costs about 140 ns, the window's bytes about 14 ns between two shims.
 * 3.13 has no _PyCFrame: its shims are read one by one. */
#define GPUMEM_PY_CSTACK_WINDOW 32768
#define GPUMEM_PY_CSTACK (GPUMEM_PY_SLOT + GPUMEM_PY_FRAME_HEAD)

/* A window is 48 KiB, more than a per-CPU map's value may be (32 KiB): the
 * windows are an array with an entry per CPU, which gpumem sizes to the
 * host's possible CPUs at load. On a CPU past them (stock IG on a larger
 * host) a walk reads no Python frames and says so. */
#define GPUMEM_STACK_WINDOWS 256

struct stack_window {
	/* What a walk reads besides the frames, first, beside the data
	 * stack's window's start: one lookup and one page for all of it. */
	__u64 lo;
	__u64 len;  /* 0: nothing read */
	__u64 clo;  /* the C stack's window */
	__u64 clen; /* 0: nothing read */
	struct tstate_head head;
	/* the data stack's window, the slot, the C stack's window (and room
	 * for a frame's head past it, which the verifier cannot tell unused) */
	__u8 bytes[GPUMEM_PY_STACK_WINDOW + GPUMEM_PY_FRAME_HEAD + GPUMEM_PY_CSTACK_WINDOW + GPUMEM_PY_FRAME_HEAD]
		__attribute__((aligned(8)));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GPUMEM_STACK_WINDOWS);
	__type(key, __u32);
	__type(value, struct stack_window);
} stack_windows SEC(".maps");

/* this_cpu_window returns this CPU's stack window: its user is the holder
 * of this CPU's scratch event (hold_scratch). */
static __always_inline struct stack_window *this_cpu_window(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	return bpf_map_lookup_elem(&stack_windows, &cpu);
}

/* read_stack_window reads the thread's data stack chunk, from its start or
 * as far below the top frame as the window holds, up to the top frame's
 * head. A window from the chunk's start holds the chunk's size
 * (_PyStackChunk: previous, size, top, data), checked there after the
 * read: a read of user memory fewer (about 60 ns) than reading it first. */
static __always_inline void read_stack_window(struct stack_window *w, const struct gpumem_python *py,
					      const struct tstate_head *h, __u64 top)
{
	w->len = 0;
	if (py->tstate_datastack_chunk == GPUMEM_PY_NO_FIELD || !top)
		return;
	__u64 chunk = tstate_u64(h, py->tstate_datastack_chunk);
	__u64 end = top + GPUMEM_PY_FRAME_HEAD;
	if (!chunk || top < chunk)
		return;
	__u64 lo = chunk;
	if (end - chunk > GPUMEM_PY_STACK_WINDOW) {
		if (end > chunk + read_ptr(chunk + 8))
			return;
		lo = end - GPUMEM_PY_STACK_WINDOW;
	}
	__u64 len = end - lo;
	if (len > GPUMEM_PY_STACK_WINDOW || bpf_probe_read_user(w->bytes, len, (void *)lo))
		return;
	if (lo == chunk && end > chunk + aligned_u64(w->bytes, 8))
		return;
	w->lo = lo;
	w->len = len;
}

/* read_cstack_window reads the C stack's window from at, span bytes (at
 * least a frame's head); false when they cannot be read. */
static __always_inline bool read_cstack_window(struct stack_window *w, __u64 at, __u64 span)
{
	if (span < GPUMEM_PY_FRAME_HEAD)
		span = GPUMEM_PY_FRAME_HEAD;
	if (span > GPUMEM_PY_CSTACK_WINDOW)
		span = GPUMEM_PY_CSTACK_WINDOW;
	w->clo = at;
	w->clen = 0;
	if (bpf_probe_read_user(&w->bytes[GPUMEM_PY_CSTACK], span, (void *)at))
		return false;
	w->clen = span;
	return true;
}

/* cstack_window_holds is all ones when a C stack's window holds reach
 * (below the window's start, it wrapped), else 0, computed without a
 * branch: a branch in the walk doubles the paths the verifier walks
 * (gpumem_leave: 54% to 68% of its limit). */
static __always_inline __u64 cstack_window_holds(__u64 reach)
{
	__u64 over = reach / GPUMEM_PY_CSTACK_WINDOW; /* 0 when it holds it */
	return ((over | -over) >> 63) - 1;
}

/* locate_frame returns where frame's head is in w: in the data stack's
 * window, or in the slot, copied from the C stack's window or read;
 * GPUMEM_PY_UNREADABLE when it cannot be read. *creach keeps how far above
 * the C stack's window's start the last frame it holds lies: the farthest,
 * as a walk goes up the C stack from its innermost shim. (The larger of
 * two, computed without a branch, takes the verifier past its limit.) */
#define GPUMEM_PY_UNREADABLE (~0ULL)

static __always_inline __u64 locate_frame(struct stack_window *w, __u64 frame, __u64 *creach)
{
	if (frame >= w->lo && frame - w->lo + GPUMEM_PY_FRAME_HEAD <= w->len)
		return frame - w->lo;
	__u64 reach = frame - w->clo + GPUMEM_PY_FRAME_HEAD;
	__u64 holds = cstack_window_holds(reach);
	*creach = (reach & holds) | (*creach & ~holds);
	if (frame >= w->clo && reach <= w->clen) {
		/* Copied into the slot, so that a frame is in one of two places:
		 * a third doubles the paths the verifier walks, as an inlined copy
		 * does. The mask changes nothing (clen is at most the window's
		 * size, a power of 2): it tells the verifier the copy's bounds. */
		__u64 off = (reach - GPUMEM_PY_FRAME_HEAD) & (GPUMEM_PY_CSTACK_WINDOW - 1);
		if (bpf_probe_read_kernel(&w->bytes[GPUMEM_PY_SLOT], GPUMEM_PY_FRAME_HEAD, &w->bytes[GPUMEM_PY_CSTACK + off]))
			return GPUMEM_PY_UNREADABLE;
		return GPUMEM_PY_SLOT;
	}
	if (bpf_probe_read_user(&w->bytes[GPUMEM_PY_SLOT], GPUMEM_PY_FRAME_HEAD, (void *)frame) &&
	    bpf_probe_read_user(&w->bytes[GPUMEM_PY_SLOT], GPUMEM_PY_FRAME_MIN, (void *)frame))
		return GPUMEM_PY_UNREADABLE;
	return GPUMEM_PY_SLOT;
}

/* frame_u64 and frame_u8 read the field at offset off of the frame at at
 * in w. */
static __always_inline __u64 frame_u64(const struct stack_window *w, __u64 at, __u16 off)
{
	__u64 i = at + off;
	if (i > sizeof(w->bytes) - 8)
		return 0;
	return aligned_u64(w->bytes, i);
}

static __always_inline __u8 frame_u8(const struct stack_window *w, __u64 at, __u16 off)
{
	__u64 i = at + off;
	if (i > sizeof(w->bytes) - 1)
		return 0;
	return w->bytes[i];
}

static __always_inline void read_frame(const struct gpumem_python *py, const struct stack_window *w, __u64 at,
				       __u64 frame, struct gpumem_pyframe *f)
{
	f->code = frame_u64(w, at, py->frame_code);
	f->instr = frame_u64(w, at, py->frame_instr);
	if (py->instr_size == 4)
		f->instr &= 0xffffffff;
	f->cls = 0;
	f->flags = 0;
	if (py->frame_is_entry != GPUMEM_PY_NO_FIELD && frame_u8(w, at, py->frame_is_entry))
		f->flags = GPUMEM_PYFRAME_ENTRY;
	if (py->frame_localsplus != GPUMEM_PY_NO_FIELD) {
		/* 3.10: one evaluation loop per frame; no qualified names, so keep
		 * the class of the first argument: the object itself when it is
		 * a class (cls), else its type (self). */
		f->flags = GPUMEM_PYFRAME_ENTRY;
		__u64 arg = read_ptr(frame + py->frame_localsplus);
		if (arg) {
			__u64 type = read_ptr(arg + 8); /* ob_type */
			__u64 tp_flags = read_ptr(type + py->type_flags);
			f->cls = tp_flags & (1UL << 31) /* Py_TPFLAGS_TYPE_SUBCLASS */ ? arg : type;
		}
	}
}

struct walk_frames {
	struct gpumem_python py;
	__u64 frame;
	__u64 creach; /* as far as this walk finds shims above the C stack's window's start */
	__u32 n;
	__u16 flags;
};

/* Masks, all ones when the comparison holds, else 0, computed without a
 * branch (see cstack_window_holds); a and b below 2^63. */
static __always_inline __u64 equal_mask(__u64 a, __u64 b)
{
	__u64 v = a ^ b;
	return ((v | -v) >> 63) - 1;
}

static __always_inline __u64 at_most_mask(__u64 a, __u64 b)
{
	return ((b - a) >> 63) - 1;
}

/* cstack_u64 and cstack_u8 read the C stack's window at offset off,
 * bounded by a mask instead of a branch. */
static __always_inline __u64 cstack_u64(const struct stack_window *w, __u64 off)
{
	return aligned_u64(w->bytes, GPUMEM_PY_CSTACK + (off & (GPUMEM_PY_CSTACK_WINDOW - 1)));
}

static __always_inline __u8 cstack_u8(const struct stack_window *w, __u64 off)
{
	return w->bytes[GPUMEM_PY_CSTACK + (off & (GPUMEM_PY_CSTACK_WINDOW - 1))];
}

/* pass_window_shim moves c past its frame when that is a shim the C
 * stack's window holds, to the shim's caller, and flags f, the frame the
 * shim entered, an entry. Without a branch: the window's bytes are read
 * either way (at its start, which the walk just read, when it does not
 * hold the frame), and what is kept is chosen by masks. A shim so passed
 * costs no step of the walk and no copy into the slot (about 40 ns each: a
 * Llama's allocation passes 16). A shim the window does not hold is
 * walked as a frame. */
static __always_inline void pass_window_shim(struct walk_frames *c, struct gpumem_pyframe *f,
					     const struct stack_window *w)
{
	__u64 reach = c->frame - w->clo + GPUMEM_PY_FRAME_HEAD;
	__u64 held = cstack_window_holds(reach) & at_most_mask(reach, w->clen);
	__u64 off = (reach - GPUMEM_PY_FRAME_HEAD) & held;
	__u64 shim = held & ~equal_mask(c->py.owner_cstack, 0) &
		     equal_mask(cstack_u8(w, off + c->py.frame_owner), c->py.owner_cstack);
	c->frame = (cstack_u64(w, off + c->py.frame_previous) & shim) | (c->frame & ~shim);
	c->creach = (reach & shim) | (c->creach & ~shim);
	f->flags |= GPUMEM_PYFRAME_ENTRY & shim;
}

/* walk_frame reads one frame into e->pystack and moves c to its caller;
 * false when the walk is over. */
static __always_inline bool walk_frame(struct walk_frames *c, struct gpumem_event *e, struct stack_window *w)
{
	if (!c->frame)
		return false;
	if (c->n >= GPUMEM_MAX_PY_FRAMES) {
		c->flags |= GPUMEM_PY_TRUNCATED;
		return false;
	}
	__u64 at = locate_frame(w, c->frame, &c->creach);
	if (at == GPUMEM_PY_UNREADABLE) {
		c->flags |= GPUMEM_PY_READ_ERROR;
		return false;
	}
	if (c->py.owner_cstack && frame_u8(w, at, c->py.frame_owner) == c->py.owner_cstack) {
		/* A shim: the frame inside it was entered from C. */
		if (c->n > 0)
			e->pystack[(c->n - 1) & (GPUMEM_MAX_PY_FRAMES - 1)].flags |= GPUMEM_PYFRAME_ENTRY;
		c->frame = frame_u64(w, at, c->py.frame_previous);
		return true;
	}
	struct gpumem_pyframe *f = &e->pystack[c->n & (GPUMEM_MAX_PY_FRAMES - 1)];
	read_frame(&c->py, w, at, c->frame, f);
	c->n++;
	c->frame = frame_u64(w, at, c->py.frame_previous);
	/* A caller in the data stack's window is no shim (shims live on the
	 * C stack): most callers skip pass_window_shim's masks. One compare,
	 * not locate_frame's two: a second branch here takes gpumem_leave
	 * from 69% to 70% of the verifier's limit. */
	if (c->frame - w->lo >= w->len)
		pass_window_shim(c, f, w);
	return true;
}

/* A walk that takes the frames the data stack's window holds first: what
 * walk_window_frame needs besides the walk's state. Apart from struct
 * walk_frames, whose layout the other walking programs' verification
 * turns on (two fields more there take gpumem_leave from 69% to 84% of
 * the verifier's limit). Both fields follow from py, computed once: from
 * py in each frame's step, with or without a branch, gpumem_tensor passes
 * the verifier's limit. */
struct window_walk {
	struct walk_frames c;
	__u64 instr_mask; /* the instruction's bytes (py.instr_size) */
	__u32 entry_flag; /* GPUMEM_PYFRAME_ENTRY where frames have is_entry (3.11), else 0 */
};

/* walk_window_frame reads a frame the data stack's window holds into
 * e->pystack and moves the walk to its caller, as walk_frame does with
 * fewer instructions (about 30 against 85 a frame): such a frame is no
 * shim (shims live on the C stack) and its fields lie in the window's
 * bytes (pystack checks that a 3.11+ layout's lie in a frame's first
 * GPUMEM_PY_FRAME_MIN bytes; the masks only tell the verifier so). False
 * when the window does not hold the walk's frame or the walk is full:
 * walk_frame takes it from there. */
static __always_inline bool walk_window_frame(struct window_walk *ww, struct gpumem_event *e,
					      const struct stack_window *w)
{
	struct walk_frames *c = &ww->c;
	__u64 at = c->frame - w->lo;
	if (at > GPUMEM_PY_STACK_WINDOW - GPUMEM_PY_FRAME_HEAD || at + GPUMEM_PY_FRAME_HEAD > w->len ||
	    c->n >= GPUMEM_MAX_PY_FRAMES)
		return false;
	struct gpumem_pyframe *f = &e->pystack[c->n & (GPUMEM_MAX_PY_FRAMES - 1)];
	f->code = aligned_u64(w->bytes, at + (c->py.frame_code & (GPUMEM_PY_FRAME_HEAD - 1)));
	f->instr = aligned_u64(w->bytes, at + (c->py.frame_instr & (GPUMEM_PY_FRAME_HEAD - 1))) & ww->instr_mask;
	f->cls = 0;
	__u32 entry = w->bytes[at + (c->py.frame_is_entry & (GPUMEM_PY_FRAME_HEAD - 1))];
	f->flags = ((0 - entry) >> 31) & ww->entry_flag;
	c->n++;
	c->frame = aligned_u64(w->bytes, at + (c->py.frame_previous & (GPUMEM_PY_FRAME_HEAD - 1)));
	if (c->frame - w->lo >= w->len)
		pass_window_shim(c, f, w);
	return true;
}

/* Frames one bpf_loop step walks: a step's call and map lookups cost about
 * what reading a frame from the window does. */
#define GPUMEM_PY_FRAMES_PER_STEP 4

/* Frames one step of the window's walk takes: its frames cost a third of
 * walk_frame's instructions, so that in torch's process a step's call and
 * lookups weigh more (8: 412 against 466 ns a run on an H100 machine,
 * BENCHMARKS.md). 16 take gpumem_tensor past the verifier's limit. */
#define GPUMEM_PY_WINDOW_FRAMES_PER_STEP 8

/* walk_buffers finds what a step of a walk reads and writes: this CPU's
 * scratch event and stack window; false when one is missing. */
static __always_inline bool walk_buffers(struct gpumem_event **e, struct stack_window **w)
{
	__u32 zero = 0;
	*e = bpf_map_lookup_elem(&scratch, &zero);
	*w = this_cpu_window();
	return *e && *w;
}

static long walk_window_step(__u64 index, struct window_walk *ww)
{
	struct gpumem_event *e;
	struct stack_window *w;
	if (!walk_buffers(&e, &w))
		return 1;
	for (int i = 0; i < GPUMEM_PY_WINDOW_FRAMES_PER_STEP; i++)
		if (!walk_window_frame(ww, e, w))
			return 1;
	return 0;
}

/* walk_window walks c's frames the data stack's window holds, from its
 * top frame down to the first the window does not hold. */
static __always_inline void walk_window(struct walk_frames *c)
{
	struct window_walk ww = {
		.c = *c,
		.instr_mask = c->py.instr_size == 4 ? 0xffffffff : ~0ULL,
		.entry_flag = c->py.frame_is_entry != GPUMEM_PY_NO_FIELD ? GPUMEM_PYFRAME_ENTRY : 0,
	};
	bpf_loop(GPUMEM_MAX_PY_WALK / GPUMEM_PY_WINDOW_FRAMES_PER_STEP, walk_window_step, &ww, 0);
	*c = ww.c;
}

static long walk_frames_step(__u64 index, struct walk_frames *c)
{
	struct gpumem_event *e;
	struct stack_window *w;
	if (!walk_buffers(&e, &w))
		return 1;
	for (int i = 0; i < GPUMEM_PY_FRAMES_PER_STEP; i++)
		if (!walk_frame(c, e, w))
			return 1;
	return 0;
}

/* current_frame reads the top frame from the thread's _PyCFrame at cframe
 * (3.11, 3.12), with the C stack above it as far as span. */
static __always_inline __u64 current_frame(struct stack_window *w, __u64 cframe, __u16 off, __u64 span)
{
	if (off < GPUMEM_PY_FRAME_HEAD - 8 && read_cstack_window(w, cframe, span))
		return frame_u64(w, GPUMEM_PY_CSTACK, off);
	return read_ptr(cframe + off);
}

/* thread_of returns the calling thread's python_thread, its process's walk
 * read again when python_procs changed since; NULL when the thread's
 * storage cannot be made. */
static __always_inline struct python_thread *thread_of(__u32 pid)
{
	__u32 zero = 0;
	__u64 *generation = bpf_map_lookup_elem(&python_generation, &zero);
	struct python_thread *t =
		bpf_task_storage_get(&python_threads, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t || !generation)
		return NULL;
	__u64 now = *(volatile __u64 *)generation; /* before python_procs, which changes first */
	if (t->generation == now)
		return t;
	struct gpumem_python *py = bpf_map_lookup_elem(&python_procs, &pid);
	t->python = py != NULL;
	if (py)
		t->py = *py;
	t->generation = now;
	return t;
}

/* capture_python walks the calling thread t's Python frames, innermost
 * first, into e->pystack. A thread whose storage could not be made has its
 * Python process's frames flagged missing. With window_first, the frames
 * the data stack's window holds are walked by their own loop first (the
 * tensor probes: their walks are most of what the agent costs); the other
 * walking programs leave it out, which would take gpumem_leave from 69% to
 * 86% of the verifier's limit. */
static __always_inline void capture_python(struct gpumem_event *e, struct python_thread *t, bool window_first)
{
	if (!t) {
		if (bpf_map_lookup_elem(&python_procs, &e->proc.pid))
			e->stack_flags = GPUMEM_PY_NO_THREAD;
		return;
	}
	if (!t->python)
		return;
	struct stack_window *w = this_cpu_window();
	if (!w) {
		e->stack_flags = GPUMEM_PY_READ_ERROR;
		return;
	}
	struct tstate_head *h = &w->head;
	if (!find_thread_state(h, t)) {
		e->stack_flags = GPUMEM_PY_NO_THREAD;
		return;
	}
	struct gpumem_python *py = &t->py;
	struct walk_frames c = {.py = *py, .frame = tstate_u64(h, py->tstate_frame)};
	w->clo = w->clen = 0;
	if (py->cframe_current_frame != GPUMEM_PY_NO_FIELD)
		c.frame = current_frame(w, c.frame, py->cframe_current_frame, t->cspan);
	read_stack_window(w, py, h, c.frame);
	if (window_first)
		walk_window(&c);
	bpf_loop(GPUMEM_MAX_PY_WALK / GPUMEM_PY_FRAMES_PER_STEP, walk_frames_step, &c, 0);
	t->cspan = c.creach;
	if (c.frame && !c.flags)
		c.flags = GPUMEM_PY_TRUNCATED; /* more shims than the walk allows */
	e->pystack_len = c.n;
	e->stack_flags = c.flags;
}

#endif
