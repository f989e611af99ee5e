"""A CUDA driver workload in Python, calling the driver through ctypes.

Same protocol as simwork.c: prints "ready PID", waits for a line on stdin,
runs, prints "done" and "expect ..." totals, waits for a line (or EOF), exits.
The driver library is SIMCUDA_LIB, or libcuda.so.1 from the loader's path.

    python3 simwork.py model   nested functions, four threads, frees
    python3 simwork.py pairs   alloc+free pairs from Python (SIMWORK_PAIRS, default
                               20000); expects ns_per_pair
    python3 simwork.py sites   one allocation of a distinct size from each kind
                               of Python code; expects lineSIZE=LINE for each,
                               LINE being the caller's line of cuda_malloc
    python3 simwork.py tensors tensors from the simulated PyTorch allocator
                               (SIMTORCH_LIB, or libc10_cuda.so) in three functions;
                               expects tensor_FUNCTION=live bytes for each
    python3 simwork.py tensor_oom
                               fills device memory with tensors (fill_cache), then asks
                               five times for more than is left (big_batch): out of
                               memory; then allocates what fits (after_oom); expects
                               held=bytes in tensors, requested=bytes asked,
                               tensor_after_oom=bytes
    python3 simwork.py views   the tensors scenario, and a workspace straight from the
                               driver (as cuBLAS makes one); expects driver_live=the
                               driver's used bytes on device 0 (cuMemGetInfo), reserved,
                               allocated and tensor_live= the allocator's own account
                               (memory_reserved(), memory_allocated() and the requested
                               bytes of live tensors: the tensor view)
    python3 simwork.py breakdown
                               the views scenario with a gradient (2 MiB) made on a
                               native thread named pt_autograd_0, as a backward pass
                               makes it; expects tensor_gradients too
    python3 simwork.py fraction_oom
                               torch.cuda.set_per_process_memory_fraction(0.25) of an
                               88 MiB device, a 4 MiB tensor, then 24 MiB asked: refused
                               by the allocator's limit, not the driver; expects result,
                               requested, reserved
    python3 simwork.py tensor_spike
                               load_weights' tensors held (12 MiB), then a spike of
                               tensors from activation_spike (5 x 6 MiB), all freed, and
                               the allocator's cache emptied; expects the allocator's
                               peaks since reset_peak_memory_stats (tensor_peak: the
                               requested bytes', allocated_peak, reserved_peak), what
                               each function held at the tensor view's peak
                               (peak_FUNCTION), and what is left (tensor_live, reserved)

    python3 simwork.py restart restart_weights (3 x 4 MiB) and restart_scratch (2 x 1 MiB);
                               prints "held" and waits for a line; frees a scratch buffer
                               and makes gap_one's 5 MiB; prints "gap_one" and waits;
                               frees the other and makes gap_two's 7 MiB

    python3 simwork.py leak    leak_weights' 8 MiB, then steps, each on a line "step" after
                               printing "step" (any other line ends them): leak_step keeps
                               1 MiB more (a leak), steady_step allocates 4 MiB and frees
                               it, plateau_step keeps 2 MiB more for the first three steps
                               only (a cache that fills, then stays)
    python3 simwork.py noleak  the leak scenario without leak_step

    python3 simwork.py tensor_late
                               early_weights' tensors (3 x 1 MiB), then prints "early" and
                               waits for a line (a tensor view is switched on then); then
                               late_activations' (2 x 2 MiB, held), late_scratch's (3 MiB,
                               freed) and two of the early tensors freed; expects
                               tensor_late_activations=live bytes, frees_before_view=2

    python3 simwork.py graph_tree
                               CUDA graph trees as Inductor runs them (torch.compile's
                               reduce-overhead), on the simulated allocator's private pool:
                               graph_weights (2 x 4 MiB, default pool), a warm-up and two
                               recordings in the pool, checkpoint restores that free and
                               make blocks live again without the USDT sites, the dead
                               tensors' blocks freed with raw_delete, a block of
                               caching_allocator_alloc (raw_alloc) held midway; prints "live" (its
                               requested bytes, current and peak, as expect values) midway
                               and waits for a line; expects tensor_live and tensor_peak
                               (the allocator's requested bytes, current and peak),
                               peak_in_restore (the weights and the pool's whole 20 MiB
                               segment, made live at once by a restore), reserved, and
                               pool_reserved and pool_requested (the private pool's segments
                               and its live tensors' requests), midway too

    python3 simwork.py stacks  allocations from SIMWORK_STACKS (default 100) functions
                               generated at run time, layer_FIRST to layer_FIRST+N-1
                               (SIMWORK_FIRST, default 0): distinct Python frames, so
                               that processes given disjoint ranges share no frame;
                               each allocates twice and frees once; expects totals
    python3 simwork.py dlopen  SIMWORK_CYCLES (default 5) cycles of: the driver loaded
                               (ctypes, as a framework loads it), cuInit, allocations
                               and frees, the driver unloaded (dlclose); expects totals
    python3 simwork.py tensor_repeats
                               tensors from three stacks, 50 each: 30 calls deep on a
                               thread of its own (3072 bytes), then 30 and 10 deep in
                               turn on the main thread (1024, 2048 bytes); expects
                               frames3072= and so on, each stack's Python frames

The tensor scenarios call the allocator straight from the named functions,
as PyTorch code calls torch.empty: those are the innermost Python frames.
"""
import _ctypes
import asyncio
import ctypes
import os
import sys
import threading
import time


def load_driver():
    lib = ctypes.CDLL(os.environ.get("SIMCUDA_LIB", "libcuda.so.1"))
    lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    return lib


cuda = load_driver()

torch = None  # the simulated allocator, loaded by the tensor scenarios


def load_allocator():
    global torch
    torch = ctypes.CDLL(os.environ.get("SIMTORCH_LIB", "libc10_cuda.so"))
    torch.simtorch_malloc.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    torch.simtorch_free.argtypes = [ctypes.c_void_p]
    for stat in ("reserved", "allocated", "requested"):
        for f in (getattr(torch, "simtorch_memory_" + stat), getattr(torch, "simtorch_max_memory_" + stat)):
            f.argtypes, f.restype = [ctypes.c_int], ctypes.c_size_t
    torch.simtorch_reset_peak_memory_stats.argtypes = [ctypes.c_int]
    torch.simtorch_inactive_bytes.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)]
    torch.simtorch_set_memory_fraction.argtypes = [ctypes.c_int, ctypes.c_double]
    torch.simtorch_malloc_on_thread.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    torch.simtorch_inactive_bytes.restype = ctypes.c_size_t
    torch.simtorch_raw_delete.argtypes = [ctypes.c_void_p]
    torch.simtorch_raw_alloc.argtypes, torch.simtorch_raw_alloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    torch.simtorch_raw_alloc_with_stream.argtypes = [ctypes.c_size_t, ctypes.c_void_p]
    torch.simtorch_raw_alloc_with_stream.restype = ctypes.c_void_p
    torch.simtorch_graph_pool_handle.restype = ctypes.c_uint64
    for f in (torch.simtorch_begin_allocate_to_pool, torch.simtorch_end_allocate_to_pool, torch.simtorch_release_pool):
        f.argtypes = [ctypes.c_int, ctypes.c_uint64]
    for f in (torch.simtorch_pool_reserved, torch.simtorch_pool_requested):
        f.argtypes, f.restype = [ctypes.c_int, ctypes.c_uint64], ctypes.c_size_t
    torch.simtorch_get_checkpoint_state.argtypes, torch.simtorch_get_checkpoint_state.restype = [ctypes.c_int, ctypes.c_uint64], ctypes.c_void_p
    torch.simtorch_free_checkpoint_state.argtypes = [ctypes.c_void_p]
    torch.simtorch_set_checkpoint_pool_state.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                                         ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    torch.simtorch_set_checkpoint_pool_state.restype = ctypes.c_size_t


totals = {"allocs": 0, "alloc_bytes": 0, "frees": 0, "freed_bytes": 0}
totals_lock = threading.Lock()
callers = {}  # size -> line of the call to cuda_malloc
context = ctypes.c_void_p()  # device 0's primary context, current on every thread, as the
# CUDA runtime makes it: lazily, at the first call
local = threading.local()


def count(key_count, key_bytes, nbytes):
    with totals_lock:
        totals[key_count] += 1
        totals[key_bytes] += nbytes


def cuda_malloc(nbytes):
    callers[nbytes] = sys._getframe(1).f_lineno
    if not getattr(local, "has_context", False):
        if not context:
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0)
        cuda.cuCtxSetCurrent(context)
        local.has_context = True
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), nbytes)  # the driver call
    if rc != 0:
        raise MemoryError(f"cuMemAlloc_v2({nbytes}) = {rc}")
    count("allocs", "alloc_bytes", nbytes)
    return ptr.value


def cuda_free(ptr, nbytes):
    rc = cuda.cuMemFree_v2(ptr)
    if rc != 0:
        raise RuntimeError(f"cuMemFree_v2 = {rc}")
    count("frees", "freed_bytes", nbytes)


def load_model(layers):
    def allocate_layer(i):
        return cuda_malloc((i + 1) << 20)

    return [allocate_layer(i) for i in range(layers)]


def worker(index, iterations):
    held = []
    for i in range(iterations):
        nbytes = 4096 * (index + 1)
        held.append((cuda_malloc(nbytes), nbytes))
        if len(held) > 4:
            cuda_free(*held.pop(0))
    for ptr, nbytes in held[:2]:
        cuda_free(ptr, nbytes)


def model():
    weights = load_model(8)
    cuda_free(weights[0], 1 << 20)
    threads = [threading.Thread(target=worker, args=(i, 500)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---- sites: each allocates once, with a size of its own ----


def module_function():
    cuda_malloc(1001)


class Model:
    def method(self):
        cuda_malloc(1002)

    @classmethod
    def class_method(cls):
        cuda_malloc(1003)

    @staticmethod
    def static_method():
        cuda_malloc(1004)


def outer():
    def inner():
        cuda_malloc(1005)

    inner()


class Outer:
    class Inner:
        def method(self):
            cuda_malloc(1006)


class Loader:
    class Shard:
        def pin(self):
            cuda_malloc(1031)

        @classmethod
        def open(cls):
            cuda_malloc(1032)

        @staticmethod
        def size():
            cuda_malloc(1033)

        @property
        def nbytes(self):
            return cuda_malloc(1034)


class Base:
    def release(self):
        cuda_malloc(1035)

    @classmethod
    def create(cls):
        cuda_malloc(1036)


class Derived(Base):
    pass


def generate_buffers():
    yield cuda_malloc(1007)


async def load_async():
    await asyncio.sleep(0)
    cuda_malloc(1008)


def thread_one():
    cuda_malloc(1011)


def thread_two():
    cuda_malloc(1012)


def thread_three():
    cuda_malloc(1013)


def thread_four():
    cuda_malloc(1014)


class Layer:
    """Called as nn.Module is: each call enters the evaluation loop from C
    (a shim frame on the C stack, 3.12+), about 800 bytes of C stack apart."""

    def __call__(self, depth, nbytes):
        if depth == 0:
            cuda_malloc(nbytes)
        else:
            self(depth - 1, nbytes)


def recurse(depth):
    if depth == 0:
        cuda_malloc(1020)
    else:
        recurse(depth - 1)


def sites():
    module_function()
    Model().method()
    Model.class_method()
    Model.static_method()
    outer()
    Outer.Inner().method()
    Loader.Shard().pin()
    Loader.Shard.open()
    Loader.Shard.size()
    Loader.Shard().nbytes
    Derived().release()
    Derived.create()
    list(generate_buffers())
    asyncio.run(load_async())
    threads = [threading.Thread(target=f) for f in (thread_one, thread_two, thread_three, thread_four)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recurse(200)
    # Twice: the second walk reads the shims its thread's first found, in
    # the C stack's window (about forty calls) and past it.
    Layer()(NESTED_CALLS - 1, 1041)
    Layer()(NESTED_CALLS - 1, 1042)


NESTED_CALLS = 48


def pairs():
    n = int(os.environ.get("SIMWORK_PAIRS", "20000"))
    cuda_free(cuda_malloc(4096), 4096)  # the context, before the clock starts
    ptr = ctypes.c_uint64()
    alloc, free, ref = cuda.cuMemAlloc_v2, cuda.cuMemFree_v2, ctypes.byref(ptr)
    start = time.perf_counter_ns()
    for _ in range(n):
        alloc(ref, 4096)
        free(ptr.value)
    totals["ns_per_pair"] = (time.perf_counter_ns() - start) // n


def load_weights(held):
    for _ in range(3):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 4 << 20, ctypes.byref(ptr)):
            raise MemoryError("load_weights")
        held.append(ptr.value)
    totals["tensor_load_weights"] = 3 * (4 << 20)


def kv_cache(held):
    ptr = ctypes.c_void_p()
    if torch.simtorch_malloc(0, 12 << 20, ctypes.byref(ptr)):
        raise MemoryError("kv_cache")
    held.append(ptr.value)
    totals["tensor_kv_cache"] = 12 << 20


def activations(held):
    acts = []
    for _ in range(8):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 300_000, ctypes.byref(ptr)):
            raise MemoryError("activations")
        acts.append(ptr.value)
    for ptr in acts[2:]:
        torch.simtorch_free(ptr)
    held.extend(acts[:2])
    totals["tensor_activations"] = 2 * 300_000


held_tensors = []  # live until the process exits


def tensors():
    load_weights(held_tensors)
    kv_cache(held_tensors)
    activations(held_tensors)


def early_weights(held):
    for _ in range(3):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 1 << 20, ctypes.byref(ptr)):
            raise MemoryError("early_weights")
        held.append(ptr.value)


def late_activations(held):
    for _ in range(2):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 2 << 20, ctypes.byref(ptr)):
            raise MemoryError("late_activations")
        held.append(ptr.value)


def late_scratch():
    ptr = ctypes.c_void_p()
    if torch.simtorch_malloc(0, 3 << 20, ctypes.byref(ptr)):
        raise MemoryError("late_scratch")
    torch.simtorch_free(ptr.value)


def tensor_late():
    early = []
    early_weights(early)
    print("early", flush=True)
    sys.stdin.readline()
    late = []
    late_activations(late)
    late_scratch()
    for ptr in early[:2]:
        torch.simtorch_free(ptr)
    held_tensors.extend(early[2:] + late)
    totals["tensor_late_activations"] = 2 * (2 << 20)
    totals["frees_before_view"] = 2


def restart_weights(held):
    for _ in range(3):
        held.append(cuda_malloc(4 << 20))


def restart_scratch(held):
    for _ in range(2):
        held.append(cuda_malloc(1 << 20))


def gap_one(held):
    held.append(cuda_malloc(5 << 20))


def gap_two(held):
    held.append(cuda_malloc(7 << 20))


def restart():
    """Allocations and frees in phases, each ended by printing its name and
    waiting for a line, so that an agent stops or starts between them."""
    weights, scratch, gaps = [], [], []
    restart_weights(weights)
    restart_scratch(scratch)
    for phase, step in (("held", lambda: (cuda_free(scratch[0], 1 << 20), gap_one(gaps))),
                        ("gap_one", lambda: (cuda_free(scratch[1], 1 << 20), gap_two(gaps)))):
        print(phase, flush=True)
        sys.stdin.readline()
        step()
    held_tensors.extend(weights + gaps)  # live until the process exits


def leak_weights(held):
    held.append(cuda_malloc(8 << 20))


def leak_step(held):
    ptr = ctypes.c_uint64()
    cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20)  # here: the stack's innermost Python frame
    held.append(ptr.value)


def steady_step():
    cuda_free(cuda_malloc(4 << 20), 4 << 20)


def plateau_step(held):
    if len(held) < 3:
        held.append(cuda_malloc(2 << 20))


def leak(leaking=True):
    """A leak beside a steady loop and a cache that fills then stays, a step
    at a time, so that a reader ends an interval between two steps."""
    weights, leaked, cache = [], [], []
    leak_weights(weights)
    while True:
        print("step", flush=True)
        if sys.stdin.readline().strip() != "step":
            break
        if leaking:
            leak_step(leaked)
        steady_step()
        plateau_step(cache)
    held_tensors.extend(weights + leaked + cache)  # live until the process exits


def library_workspace():
    """Device memory straight from the driver, outside the allocator."""
    cuda_malloc(6 << 20)


def driver_used(device):
    """The simulated driver's live bytes on device: total less free."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)):
        raise RuntimeError("cuMemGetInfo_v2")
    return total.value - free.value


def views():
    tensors()
    workspace_and_accounts()


def workspace_and_accounts():
    """A workspace from the driver, then the driver's and the allocator's
    accounts (the views scenario's expects)."""
    library_workspace()
    totals["driver_live"] = driver_used(0)
    totals["reserved"] = torch.simtorch_memory_reserved(0)
    totals["allocated"] = torch.simtorch_memory_allocated(0)
    totals["tensor_live"] = torch.simtorch_memory_requested(0)
    inactive_blocks()


def backward(held):
    """A gradient, made as a backward pass on a GPU makes it: on autograd's
    own thread (pt_autograd_0), with no Python frames."""
    ptr = ctypes.c_void_p()
    if torch.simtorch_malloc_on_thread(b"pt_autograd_0", 0, 2 << 20, ctypes.byref(ptr)):
        raise MemoryError("backward")
    held.append(ptr.value)
    totals["tensor_gradients"] = 2 << 20


def breakdown():
    tensors()
    backward(held_tensors)
    workspace_and_accounts()


def inactive_blocks():
    """The allocator's free blocks, as memory_snapshot()'s inactive ones."""
    largest = ctypes.c_size_t()
    totals["inactive"] = torch.simtorch_inactive_bytes(0, ctypes.byref(largest))
    totals["largest_inactive"] = largest.value


def fragment(held):
    """Four 20 MiB segments of five 4 MiB tensors each, the second and
    fourth of each freed: 32 MiB free in them, in blocks of 4 MiB."""
    tensors = []
    for _ in range(20):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 4 << 20, ctypes.byref(ptr)):
            raise MemoryError("fragment")
        tensors.append(ptr.value)
    for i, ptr in enumerate(tensors):
        if i % 5 in (1, 3):
            torch.simtorch_free(ptr)
        else:
            held.append(ptr)


def fragment_oom():
    """An out-of-memory of fragmentation (SIMCUDA_CAPACITY=88 MiB): 12 MiB
    asked with 32 MiB free in the cache, in no block larger than 4 MiB."""
    fragment(held_tensors)
    ptr = ctypes.c_void_p()
    totals["result"] = torch.simtorch_malloc(0, 12 << 20, ctypes.byref(ptr))
    totals["requested"] = 12 << 20
    totals["reserved"] = torch.simtorch_memory_reserved(0)
    inactive_blocks()


def fraction_oom():
    """An out-of-memory of PyTorch's own limit (SIMCUDA_CAPACITY=88 MiB,
    set_per_process_memory_fraction(0.25): 22 MiB): a 4 MiB tensor held in
    its 20 MiB segment, then 24 MiB asked (more than the segment's 16 MiB
    left), refused without the driver."""
    torch.simtorch_set_memory_fraction(0, 0.25)
    ptr = ctypes.c_void_p()
    if torch.simtorch_malloc(0, 4 << 20, ctypes.byref(ptr)):
        raise MemoryError("fraction_oom")
    held_tensors.append(ptr.value)
    totals["result"] = torch.simtorch_malloc(0, 24 << 20, ctypes.byref(ptr))
    totals["requested"] = 24 << 20
    totals["reserved"] = torch.simtorch_memory_reserved(0)


def activation_spike():
    """Activations, all freed before the report: the first from the cached
    rest of load_weights' segment, the others in two new 20 MiB segments."""
    acts = []
    for _ in range(5):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 6 << 20, ctypes.byref(ptr)):
            raise MemoryError("activation_spike")
        acts.append(ptr.value)
    for ptr in acts:
        torch.simtorch_free(ptr)


def tensor_spike():
    torch.simtorch_reset_peak_memory_stats(0)
    load_weights(held_tensors)
    activation_spike()
    torch.simtorch_empty_cache()
    totals.update(tensor_peak=torch.simtorch_max_memory_requested(0), allocated_peak=torch.simtorch_max_memory_allocated(0),
                  reserved_peak=torch.simtorch_max_memory_reserved(0), peak_load_weights=3 * (4 << 20),
                  peak_activation_spike=5 * (6 << 20), tensor_live=torch.simtorch_memory_requested(0),
                  reserved=torch.simtorch_memory_reserved(0))


def fill_cache(held):
    for _ in range(6):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 12 << 20, ctypes.byref(ptr)):
            raise MemoryError("fill_cache")
        held.append(ptr.value)
    totals["held"] = 6 * (12 << 20)


def big_batch():
    for _ in range(5):  # retried, as a training loop that catches the error does
        ptr = ctypes.c_void_p()
        rc = torch.simtorch_malloc(0, 40 << 20, ctypes.byref(ptr))
    totals["requested"] = 40 << 20
    totals["result"] = rc


def after_oom(held):
    for _ in range(4):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 1 << 20, ctypes.byref(ptr)):
            raise MemoryError("after_oom")
        held.append(ptr.value)
    totals["tensor_after_oom"] = 4 * (1 << 20)


def tensor_oom():
    """Run with SIMCUDA_CAPACITY=104857600 (100 MiB): 72 MiB held, 40 more
    asked five times, then 4 MiB more, which fit."""
    fill_cache(held_tensors)
    big_batch()
    after_oom(held_tensors)


# ---- stacks: functions generated at run time, each a frame of its own ----


generated = {}  # the functions live until the process exits, as a model's code does: a
# frame is named from its code object after the call, which must still be there


def graph_weights(held):
    for _ in range(2):
        ptr = ctypes.c_void_p()
        if torch.simtorch_malloc(0, 4 << 20, ctypes.byref(ptr)):
            raise MemoryError("graph_weights")
        held.append(ptr.value)


def warmup_run(pool, outputs, workspaces):
    """CUDAWarmupNode.run: in the pool, an output (logits) left live; and a
    library's own memory from the driver (cuBLAS's workspace), not the
    pool's."""
    torch.simtorch_begin_allocate_to_pool(0, pool)
    ptr = ctypes.c_void_p()
    if torch.simtorch_malloc(0, (5 << 20) + 100, ctypes.byref(ptr)):
        raise MemoryError("warmup_run")
    outputs.append(ptr.value)
    workspaces.append(cuda_malloc(3 << 20))
    torch.simtorch_end_allocate_to_pool(0, pool)


def record_graph(pool, scratch, output, outputs):
    """CUDAGraphNode._record: scratch freed, an output left live; then the
    pool's checkpoint, as the tree takes it after each recording."""
    torch.simtorch_begin_allocate_to_pool(0, pool)
    tmp, out = ctypes.c_void_p(), ctypes.c_void_p()
    if torch.simtorch_malloc(0, scratch, ctypes.byref(tmp)) or torch.simtorch_malloc(0, output, ctypes.byref(out)):
        raise MemoryError("record_graph")
    torch.simtorch_free(tmp.value)
    outputs.append(out.value)
    torch.simtorch_end_allocate_to_pool(0, pool)
    return torch.simtorch_get_checkpoint_state(0, pool)


def apply_checkpoint(state, stale, live, dead):
    """apply_checkpoint_execution_state_in_allocator: the pool set back to
    state; the stale outputs' blocks freed inside the allocator (their
    storages lose their deleter: never freed again), the live ones adopted,
    the blocks of tensors dead since freed with raw_delete."""
    freed, created = (ctypes.c_void_p * 64)(), (ctypes.c_void_p * 64)()
    nfreed = ctypes.c_size_t()
    n = torch.simtorch_set_checkpoint_pool_state(0, state, freed, ctypes.byref(nfreed), created, 64)
    made = {created[i] for i in range(n)}
    for ptr in [p for p in stale if p in {freed[i] for i in range(nfreed.value)}]:
        stale.remove(ptr)
    for ptr in dead:
        if ptr not in made:
            raise RuntimeError(f"{ptr:#x} not made live by the restore")
        torch.simtorch_raw_delete(ptr)
    live.extend(made - set(dead))


def caching_allocator_alloc(nbytes, stream=None):
    """torch.cuda.caching_allocator_alloc: a block without the USDT site."""
    ptr = torch.simtorch_raw_alloc(nbytes) if stream is None else torch.simtorch_raw_alloc_with_stream(nbytes, stream)
    if not ptr:
        raise MemoryError("caching_allocator_alloc")
    return ptr


def graph_tree():
    weights, warm, a_out, b_out, workspaces = [], [], [], [], []
    graph_weights(weights)
    pool = torch.simtorch_graph_pool_handle()
    warmup_run(pool, warm, workspaces)
    ckpt_a = record_graph(pool, 8 << 20, (2 << 20) + 300, a_out)
    torch.simtorch_free(a_out.pop())  # the user drops A's output; replays make it again
    replayed_a = []  # A replayed: outputs on A's blocks, not the allocator's
    # A new path from A: the warm-up's output is stale, A's replayed output live.
    apply_checkpoint(ckpt_a, warm, replayed_a, dead=list(warm))
    ckpt_b = record_graph(pool, 1 << 20, (3 << 20) + 7, b_out)
    scratch = [caching_allocator_alloc(786_435), caching_allocator_alloc(1000, stream=7)]
    print("live " + " ".join(f"{k}={v}" for k, v in
                             {"tensor_live": torch.simtorch_memory_requested(0),
                              "tensor_peak": torch.simtorch_max_memory_requested(0),
                              "reserved": torch.simtorch_memory_reserved(0),
                              "pool_reserved": torch.simtorch_pool_reserved(0, pool),
                              "pool_requested": torch.simtorch_pool_requested(0, pool)}.items()), flush=True)
    sys.stdin.readline()
    torch.simtorch_free(replayed_a.pop())
    for ptr in scratch:
        torch.simtorch_raw_delete(ptr)  # torch.cuda.caching_allocator_delete
    # Another path from A: B's output stale; A's and the warm-up's blocks,
    # made live again by the restore, belong to tensors dead since.
    made = []
    apply_checkpoint(ckpt_a, b_out, made, dead=[])
    for ptr in made:
        torch.simtorch_raw_delete(ptr)
    for state in (ckpt_a, ckpt_b):
        torch.simtorch_free_checkpoint_state(state)
    for _ in range(3):  # the warm-up's and the two graphs' uses of the pool end
        torch.simtorch_release_pool(0, pool)
    torch.simtorch_empty_cache()
    cuda_free(workspaces.pop(), 3 << 20)
    held_tensors.extend(weights)
    totals.update(tensor_live=torch.simtorch_memory_requested(0), tensor_peak=torch.simtorch_max_memory_requested(0),
                  peak_in_restore=(8 << 20) + (20 << 20), reserved=torch.simtorch_memory_reserved(0),
                  pool_reserved=torch.simtorch_pool_reserved(0, pool), pool_requested=torch.simtorch_pool_requested(0, pool))


def generated_stacks():
    n = int(os.environ.get("SIMWORK_STACKS", "100"))
    first = int(os.environ.get("SIMWORK_FIRST", "0"))
    source = "".join(f"def layer_{i}(size):\n    cuda_free(cuda_malloc(size), size)\n    return cuda_malloc(size)\n\n"
                     for i in range(first, first + n))
    exec(compile(source, "generated_layers.py", "exec"), globals(), generated)
    held = [(generated[f"layer_{i}"](1024 + i % 512), 1024 + i % 512) for i in range(first, first + n)]
    for ptr, nbytes in held[::2]:
        cuda_free(ptr, nbytes)


# ---- tensor_repeats: each thread's stacks sent once, then named ----


def python_depth():
    """The caller's Python frames, as the walk counts them."""
    frame, n = sys._getframe(1), 0
    while frame:
        frame, n = frame.f_back, n + 1
    return n


def tensor_at(depth, nbytes):
    if depth > 0:
        return tensor_at(depth - 1, nbytes)
    ptr = ctypes.c_void_p()
    if torch.simtorch_malloc(0, nbytes, ctypes.byref(ptr)):
        raise MemoryError("tensor_at")
    torch.simtorch_free(ptr.value)
    return python_depth()


REPEATS = 50


def tensor_repeats():
    """Three stacks, told by their tensors' sizes: one a thread of its own
    takes, then two the main thread takes in turn."""
    frames = {}

    def repeat(depth, nbytes):
        for _ in range(REPEATS):
            frames[nbytes] = tensor_at(depth, nbytes)

    thread = threading.Thread(target=repeat, args=(30, 3072))
    thread.start()
    thread.join()
    for _ in range(REPEATS):
        frames[1024] = tensor_at(30, 1024)
        frames[2048] = tensor_at(10, 2048)
    totals.update({f"frames{n}": d for n, d in frames.items()}, repeats=REPEATS)


def tensor_steady():
    """A tensor made and freed SIMWORK_RATE times a second (200) until a
    line on stdin."""
    rate = int(os.environ.get("SIMWORK_RATE", "200"))
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    start, n = time.monotonic(), 0
    while not stop.is_set():
        tensor_at(0, 4096)
        n += 1
        stop.wait(max(0.0, start + n / rate - time.monotonic()))
    totals["tensors"] = n


# ---- dlopen: the driver loaded and unloaded ----


def dlopen_cycles():
    global cuda
    for cycle in range(int(os.environ.get("SIMWORK_CYCLES", "5"))):
        if cycle > 0:
            cuda = load_driver()
            cuda.cuInit(0)
        held = [(cuda_malloc(8192 * (i + 1)), 8192 * (i + 1)) for i in range(4)]
        for ptr, nbytes in held:
            cuda_free(ptr, nbytes)
        # Unloaded: its context goes with it.
        context.value = None
        local.has_context = False
        _ctypes.dlclose(cuda._handle)
        cuda = None


def main():
    scenarios = {"model": model, "sites": sites, "pairs": pairs, "tensors": tensors, "tensor_oom": tensor_oom, "views": views, "breakdown": breakdown, "fragment_oom": fragment_oom, "fraction_oom": fraction_oom,
                 "tensor_spike": tensor_spike, "tensor_late": tensor_late, "graph_tree": graph_tree, "stacks": generated_stacks, "dlopen": dlopen_cycles,
                 "tensor_repeats": tensor_repeats, "tensor_steady": tensor_steady, "restart": restart, "leak": leak,
                 "noleak": lambda: leak(leaking=False)}
    if len(sys.argv) != 2 or sys.argv[1] not in scenarios:
        print("usage: simwork.py " + "|".join(scenarios), file=sys.stderr)
        sys.exit(2)
    cuda.cuInit(0)
    if sys.argv[1].startswith("tensor") or sys.argv[1] in ("views", "breakdown", "graph_tree", "fragment_oom", "fraction_oom"):
        load_allocator()  # as import torch does, before any tensor
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    scenarios[sys.argv[1]]()
    print("done", flush=True)
    expect = dict(totals, **{f"line{size}": line for size, line in sorted(callers.items())})
    print("expect " + " ".join(f"{k}={v}" for k, v in expect.items()), flush=True)
    sys.stdin.readline()
    # As simwork.c: a process that outlives its last call by this long.
    time.sleep(int(os.environ.get("SIMWORK_LINGER_MS", "0")) / 1000)


if __name__ == "__main__":
    main()
