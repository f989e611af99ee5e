"""A vLLM-shaped PyTorch workload for the agent's whole path to Pyroscope
(run_agent_pyroscope.sh): a GPUModelRunner loads its weights (load_model,
402653184 bytes in four tensors) and allocates its KV cache
(_allocate_kv_cache_tensors, 393216000 bytes in eight per-layer tensors,
as vLLM's v1 runner allocates one raw int8 tensor per layer), with
PyTorch's caching allocator on.

Usage: torch_agent.py [--sim]
Prints "ready PID" once torch and CUDA are initialized (the driver library
and libc10_cuda.so mapped, no device memory yet), waits for a line, runs,
prints "result {JSON}" and holds every tensor until a line (or EOF), exits.

The JSON: pid, comm, ready_time (when it printed ready), first_alloc
(time.time() just before the first allocation), done (after the last),
memory_allocated and memory_reserved (torch.cuda's, at the end) and, per
function ("GPUModelRunner.load_model",
"GPUModelRunner._allocate_kv_cache_tensors"), "requested" (the tensors'
bytes: what the tensor view, kind="tensor", must show), "reserved" (the
growth of memory_reserved() during the call: the segments the caching
allocator took from the driver, what the driver view, kind="device", must
show) and "tensors".

--sim runs the same class on the simulated driver and allocator
(SIMCUDA_LIB, SIMTORCH_LIB: build/sim's libcuda.so.1 and libc10_cuda.so),
through ctypes, for running the script's path on a machine without a GPU;
there memory_reserved is what the simulated driver says is in use
(cuMemGetInfo).
"""
import ctypes
import json
import os
import sys
import time

MiB = 1 << 20
WEIGHTS = [100663296] * 4  # 402653184 bytes
KV_LAYERS = [49152000] * 8  # 393216000 bytes


class TorchBackend:
    def __init__(self):
        import functools

        import torch

        self.torch = torch
        torch.cuda.init()  # loads and initializes the driver; no memory yet
        # Called straight from GPUModelRunner's methods (partial adds no
        # Python frame): they are the innermost Python frames, as model
        # code calling torch.empty is in vLLM.
        self.empty = functools.partial(torch.empty, dtype=torch.uint8, device="cuda")
        self.zeros = functools.partial(torch.zeros, dtype=torch.int8, device="cuda")

    def allocated(self):
        return self.torch.cuda.memory_allocated()

    def reserved(self):
        return self.torch.cuda.memory_reserved()

    def sync(self):
        self.torch.cuda.synchronize()


class SimBackend:
    """The simulated driver and caching allocator (make sim), through ctypes."""

    def __init__(self):
        self.cuda = ctypes.CDLL(os.environ.get("SIMCUDA_LIB", "libcuda.so.1"))
        self.alloc = ctypes.CDLL(os.environ.get("SIMTORCH_LIB", "libc10_cuda.so"))
        self.alloc.simtorch_malloc.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        self.cuda.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        self.cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        self.cuda.cuInit(0)
        ctx = ctypes.c_void_p()
        self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
        self.cuda.cuCtxSetCurrent(ctx)
        self.live = 0

    def empty(self, nbytes):
        ptr = ctypes.c_void_p()
        if self.alloc.simtorch_malloc(0, nbytes, ctypes.byref(ptr)):
            raise MemoryError(nbytes)
        self.live += (nbytes + 511) // 512 * 512
        return ptr.value

    zeros = empty

    def allocated(self):
        return self.live

    def reserved(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        return total.value - free.value

    def sync(self):
        pass


class GPUModelRunner:
    def __init__(self, backend):
        self.backend = backend
        self.weights = []
        self.kv_caches = []
        self.accounts = {}

    def _account(self, name, tensors, requested, reserved_before):
        self.accounts[f"GPUModelRunner.{name}"] = {
            "requested": requested,
            "reserved": self.backend.reserved() - reserved_before,
            "tensors": tensors,
        }

    def load_model(self):
        before = self.backend.reserved()
        empty = self.backend.empty
        for nbytes in WEIGHTS:
            self.weights.append(empty(nbytes))
        self.backend.sync()
        self._account("load_model", len(WEIGHTS), sum(WEIGHTS), before)

    def _allocate_kv_cache_tensors(self):
        before = self.backend.reserved()
        zeros = self.backend.zeros
        for nbytes in KV_LAYERS:
            self.kv_caches.append(zeros(nbytes))
        self.backend.sync()
        self._account("_allocate_kv_cache_tensors", len(KV_LAYERS), sum(KV_LAYERS), before)


def main():
    backend = SimBackend() if sys.argv[1:] == ["--sim"] else TorchBackend()
    ready = time.time()
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    runner = GPUModelRunner(backend)
    first = time.time()
    runner.load_model()
    runner._allocate_kv_cache_tensors()
    done = time.time()
    with open(f"/proc/{os.getpid()}/comm") as f:
        comm = f.read().strip()
    result = {
        "pid": os.getpid(),
        "comm": comm,
        "ready_time": ready,
        "first_alloc": first,
        "done": done,
        "memory_allocated": backend.allocated(),
        "memory_reserved": backend.reserved(),
        "functions": runner.accounts,
    }
    print("result " + json.dumps(result), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
