"""A vLLM-shaped PyTorch workload for checking gpu-mem's two views against
PyTorch's own account (issue 18, run_views.sh, check_views.py), with the
caching allocator on.

Usage: torch_views.py [--sim]
Run it after gpumem is recording (tests/gpu/protocol.sh's record_first): it
runs at once. A GPUModelRunner loads its weights (load_model), allocates its
KV cache (_allocate_kv_cache_tensors), runs a forward pass that keeps its
output and frees its activations (execute_model: an nn.Linear block, so
cuBLAS makes its handle and PyTorch its cuBLAS workspace), allocates 256 MiB
of scratch and frees it (the segment stays in the allocator's cache), and
takes a 6 MiB workspace straight from the driver, as a library beside
PyTorch would (library_workspace: cuMemAlloc_v2 through ctypes). Every tensor
size is a multiple of 512 bytes, and every large one of 2 MiB (a large block
whose segment has less than 1 MiB left is not split, and counts whole), so
that memory_allocated() (blocks) equals the tensors' own sizes
(memory_stats()'s requested_bytes).

Then, everything synchronized and held, prints:
  functions {JSON}  per GPUModelRunner method: the growth of
                    requested_bytes.all.current ("requested": its live
                    tensors, the tensor view) and of memory_reserved()
                    ("reserved": the segments it made the allocator take,
                    the driver view under the allocator)
  done
  expect pid=.. reserved=.. allocated=.. requested=.. workspace=..
         device_used=.. device_used_at_start=.. [smi_used_mib=..]
(device_used: total less free, from cudaMemGetInfo; _at_start: right after
the CUDA context was made, before any allocation; smi_used_mib: nvidia-smi's
figure for this process, if nvidia-smi runs), waits for a line, exits.

--sim runs the same on the simulated driver and allocator (SIMCUDA_LIB,
SIMTORCH_LIB: build/sim's libcuda.so.1 and libc10_cuda.so) through ctypes,
for running this path on a machine without a GPU; it has no nn.Linear.
"""
import ctypes
import json
import os
import subprocess
import sys
import time

MiB = 1 << 20


class TorchBackend:
    def __init__(self):
        import torch

        self.torch = torch
        torch.cuda.init()
        self.used_at_start = self.device_used()  # makes the context
        self.cuda = ctypes.CDLL(mapped("libcuda.so"))  # the driver torch loaded

    def empty(self, nbytes):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def free(self, tensor):
        pass  # dropping the last reference frees it

    def forward(self):
        """An nn.Linear block: weights, cuBLAS's handle and workspace, an
        output kept, the intermediate freed."""
        torch = self.torch
        up = torch.nn.Linear(1024, 4096, device="cuda")
        down = torch.nn.Linear(4096, 1024, device="cuda")
        x = torch.randn(64, 1024, device="cuda")
        with torch.no_grad():
            out = down(torch.relu(up(x)))
        return [up, down, x, out]

    def sync(self):
        self.torch.cuda.synchronize()

    def reserved(self):
        return self.torch.cuda.memory_reserved()

    def allocated(self):
        return self.torch.cuda.memory_allocated()

    def requested(self):
        return self.torch.cuda.memory_stats().get("requested_bytes.all.current", -1)

    def device_used(self):
        free, total = self.torch.cuda.mem_get_info()
        return total - free


class SimBackend:
    """The simulated driver and caching allocator (make sim), through ctypes."""

    def __init__(self):
        self.cuda = ctypes.CDLL(os.environ.get("SIMCUDA_LIB", "libcuda.so.1"))
        self.alloc = ctypes.CDLL(os.environ.get("SIMTORCH_LIB", "libc10_cuda.so"))
        self.alloc.simtorch_malloc.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        self.alloc.simtorch_free.argtypes = [ctypes.c_void_p]
        for stat in ("reserved", "allocated", "requested"):
            f = getattr(self.alloc, "simtorch_memory_" + stat)
            f.argtypes, f.restype = [ctypes.c_int], ctypes.c_size_t
        self.cuda.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        self.cuda.cuInit(0)
        ctx = ctypes.c_void_p()
        self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
        self.cuda.cuCtxSetCurrent(ctx)
        self.used_at_start = self.device_used()
        # As long as import torch takes at least: gpumem, started first,
        # finds the allocator's library in this process at its next scan
        # (every 500 ms) and the Python runtime at its start.
        time.sleep(1.5)

    def empty(self, nbytes):
        ptr = ctypes.c_void_p()
        if self.alloc.simtorch_malloc(0, nbytes, ctypes.byref(ptr)):
            raise MemoryError(nbytes)
        return ptr.value

    def free(self, ptr):
        self.alloc.simtorch_free(ptr)

    def forward(self):
        return [self.empty(256 * 1024), self.empty(16 * MiB)]

    def sync(self):
        pass

    def reserved(self):
        return self.alloc.simtorch_memory_reserved(0)

    def allocated(self):
        return self.alloc.simtorch_memory_allocated(0)

    def requested(self):
        return self.alloc.simtorch_memory_requested(0)

    def device_used(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if self.cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)):
            raise RuntimeError("cuMemGetInfo_v2")
        return total.value - free.value


class GPUModelRunner:
    """Each method allocates what it keeps itself, and frees only its own:
    its growth of PyTorch's counters is what gpu-mem must put under it."""

    def __init__(self, backend):
        self.b = backend
        self.held = []
        self.functions = {}

    def measured(self, method):
        before = (self.b.requested(), self.b.reserved())
        method()
        self.b.sync()
        self.functions["GPUModelRunner." + method.__name__] = {
            "requested": self.b.requested() - before[0],
            "reserved": self.b.reserved() - before[1],
        }

    def load_model(self):
        for _ in range(4):
            self.held.append(self.b.empty(96 * MiB))

    def _allocate_kv_cache_tensors(self):
        for _ in range(8):  # one raw tensor per layer, as vLLM's v1 runner
            self.held.append(self.b.empty(48 * MiB))

    def execute_model(self):
        activations = [self.b.empty(300 * 1024) for _ in range(40)]
        self.held.extend(self.b.forward())
        self.held.extend(activations[::4])
        for a in activations[1::4] + activations[2::4] + activations[3::4]:
            self.b.free(a)
        del activations

    def scratch(self):
        t = self.b.empty(256 * MiB)
        self.b.sync()
        self.b.free(t)
        del t


def mapped(name):
    """The path of the first file mapped in this process whose name has
    name in it (the driver library may be outside the linker's cache)."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if name in path.rsplit("/", 1)[-1]:
                return path
    raise RuntimeError(name + " is not mapped")


def library_workspace(backend):
    """Device memory straight from the driver, outside PyTorch's allocator."""
    cuda = backend.cuda
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), 6 * MiB)
    if rc != 0:
        raise RuntimeError(f"cuMemAlloc_v2 = {rc}")
    return ptr.value


def smi_used_mib(pid):
    """nvidia-smi's memory figure for pid, in MiB, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1])
    return None


def main():
    backend = SimBackend() if "--sim" in sys.argv[1:] else TorchBackend()
    runner = GPUModelRunner(backend)
    for method in (runner.load_model, runner._allocate_kv_cache_tensors, runner.execute_model, runner.scratch):
        runner.measured(method)
    library_workspace(backend)
    backend.sync()
    expect = {
        "pid": os.getpid(), "reserved": backend.reserved(), "allocated": backend.allocated(),
        "requested": backend.requested(), "workspace": 6 * MiB,
        "device_used": backend.device_used(), "device_used_at_start": backend.used_at_start,
    }
    smi = smi_used_mib(os.getpid()) if isinstance(backend, TorchBackend) else None
    if smi is not None:
        expect["smi_used_mib"] = smi
    print("functions " + json.dumps(runner.functions), flush=True)
    print("done", flush=True)
    print("expect " + " ".join(f"{k}={v}" for k, v in expect.items()), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
