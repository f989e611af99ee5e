"""A PyTorch training step whose activations make the peak, for checking
gpu-mem's peaks against PyTorch's own (issue 19, run_peaks.sh,
check_peaks.py), with the caching allocator on.

Usage: torch_peaks.py [--sim]
Run it after gpumem is recording (tests/gpu/protocol.sh's record_first): it
runs at once. build_model makes four MLP blocks (1024 -> 4096 -> 1024, no
bias, 128 MiB of weights) and an Adam optimizer; warm_up runs a small forward and backward
(the cuBLAS handles and workspaces of the main thread and of autograd's
device thread); then torch.cuda.reset_peak_memory_stats(), and one training
step: load_batch (8192 x 1024), activation_spike (the forward pass, called
from the step's own code: every block's wide activations, kept for the
backward pass, about 1.1 GiB), backward_pass (out.backward() with a
gradient of ones: autograd frees the activations as it goes; its device
thread has no Python frames), optimizer_step (Adam's first step makes its
state) and zero_grad. Every tensor's size is a multiple of 512 bytes and
every large one of 2 MiB, and no scalar tensor is made on the GPU, so that
max_memory_allocated() (blocks) equals the tensors' own sizes at the peak
(requested_bytes.all.peak).

Then, everything synchronized and held, prints:
  done
  expect pid=.. max_allocated=.. max_requested=.. max_reserved=..
         allocated=.. reserved=.. spike=..
(max_*: torch.cuda.max_memory_allocated(), memory_stats()'s
requested_bytes.all.peak and max_memory_reserved() since the reset;
allocated, reserved: now; spike: the bytes of the activations
activation_spike made), waits for a line, exits.

--sim runs the same shape on the simulated driver and allocator (SIMCUDA_LIB,
SIMTORCH_LIB: build/sim's libcuda.so.1 and libc10_cuda.so) through ctypes,
for running this path on a machine without a GPU: the forward keeps the
same activations, the backward frees them as autograd does while making the
gradients, the optimizer makes Adam's state and a temporary per parameter.
"""
import ctypes
import os
import sys
import time

MiB = 1 << 20
TOKENS, HIDDEN, WIDE, BLOCKS = 8192, 1024, 4096, 4
FP32 = 4


class TorchModel:
    """The real thing: nn.Linear blocks, GELU, Adam."""

    def __init__(self):
        import torch

        self.torch = torch
        torch.cuda.init()
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({"up": torch.nn.Linear(HIDDEN, WIDE, bias=False), "down": torch.nn.Linear(WIDE, HIDDEN, bias=False)})
            for _ in range(BLOCKS)).cuda()
        # foreach, not fused: its step counts stay on the CPU (a fused
        # Adam's are 4-byte tensors on the GPU, 512-byte blocks).
        self.opt = torch.optim.Adam(self.blocks.parameters(), lr=1e-3, foreach=True)

    def warm_up(self):
        torch = self.torch
        x = torch.ones(512, HIDDEN, device="cuda", requires_grad=True)
        y = self.blocks[0]["down"](self.blocks[0]["up"](x))
        y.backward(torch.ones_like(y))
        self.opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    def reset_peaks(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()

    def batch(self):
        return self.torch.ones(TOKENS, HIDDEN, device="cuda")

    def block(self, i, x):
        b = self.blocks[i]
        return x + b["down"](self.torch.nn.functional.gelu(b["up"](x)))

    def backward(self, out):
        out.backward(self.torch.ones_like(out))

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.torch.cuda.synchronize()

    def stats(self):
        cuda = self.torch.cuda
        return {"max_allocated": cuda.max_memory_allocated(), "max_reserved": cuda.max_memory_reserved(),
                "max_requested": cuda.memory_stats().get("requested_bytes.all.peak", -1),
                "allocated": cuda.memory_allocated(), "reserved": cuda.memory_reserved()}


class SimTensor:
    def __init__(self, alloc, nbytes):
        self.alloc, self.nbytes, self.ptr = alloc, nbytes, ctypes.c_void_p()
        if alloc.simtorch_malloc(0, nbytes, ctypes.byref(self.ptr)):
            raise MemoryError(nbytes)

    def free(self):
        if self.ptr is not None:
            self.alloc.simtorch_free(self.ptr)
            self.ptr = None


class SimModel:
    """The same shapes on the simulated driver and allocator: what autograd
    and Adam allocate and free, in their order."""

    def __init__(self):
        cuda = ctypes.CDLL(os.environ.get("SIMCUDA_LIB", "libcuda.so.1"))
        self.alloc = a = ctypes.CDLL(os.environ.get("SIMTORCH_LIB", "libc10_cuda.so"))
        a.simtorch_malloc.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        a.simtorch_free.argtypes = [ctypes.c_void_p]
        a.simtorch_reset_peak_memory_stats.argtypes = [ctypes.c_int]
        for stat in ("reserved", "allocated", "requested"):
            for f in (getattr(a, "simtorch_memory_" + stat), getattr(a, "simtorch_max_memory_" + stat)):
                f.argtypes, f.restype = [ctypes.c_int], ctypes.c_size_t
        cuda.cuInit(0)
        # As long as import torch takes at least: gpumem, started first,
        # finds the allocator's library in this process at its next scan
        # (every 500 ms) and the Python runtime at its start.
        time.sleep(1.5)
        self.weights = [SimTensor(a, HIDDEN * WIDE * FP32) for _ in range(2 * BLOCKS)]
        self.grads, self.state, self.saved = [], [], []

    def empty(self, nbytes):
        return SimTensor(self.alloc, nbytes)

    def warm_up(self):
        self.empty(32 * MiB).free()  # cuBLAS's workspace, freed here, cached

    def reset_peaks(self):
        self.alloc.simtorch_reset_peak_memory_stats(0)

    def batch(self):
        return self.empty(TOKENS * HIDDEN * FP32)

    def block(self, i, x):
        h = self.empty(TOKENS * WIDE * FP32)  # up(x)
        a = self.empty(TOKENS * WIDE * FP32)  # gelu(h)
        d = self.empty(TOKENS * HIDDEN * FP32)  # down(a)
        y = self.empty(TOKENS * HIDDEN * FP32)  # x + d
        d.free()
        self.saved.append((x, h, a))
        return y

    def backward(self, out):
        g = self.empty(TOKENS * HIDDEN * FP32)  # ones_like(out)
        out.free()
        for x, h, a in reversed(self.saved):
            self.grads.append(self.empty(WIDE * HIDDEN * FP32))  # down's weight
            ga = self.empty(TOKENS * WIDE * FP32)
            a.free()
            gh = self.empty(TOKENS * WIDE * FP32)
            ga.free()
            h.free()
            self.grads.append(self.empty(HIDDEN * WIDE * FP32))  # up's weight
            gx = self.empty(TOKENS * HIDDEN * FP32)
            gh.free()
            x.free()
            g.free()
            g = gx
        g.free()
        self.saved = []

    def step(self):
        if not self.state:
            self.state = [self.empty(w.nbytes) for w in self.weights for _ in range(2)]  # exp_avg, exp_avg_sq
        temps = [self.empty(w.nbytes) for w in self.weights]  # _foreach_sqrt
        for t in temps + self.grads:
            t.free()
        self.grads = []

    def stats(self):
        a = self.alloc
        return {"max_allocated": a.simtorch_max_memory_allocated(0), "max_reserved": a.simtorch_max_memory_reserved(0),
                "max_requested": a.simtorch_max_memory_requested(0),
                "allocated": a.simtorch_memory_allocated(0), "reserved": a.simtorch_memory_reserved(0)}


def build_model(sim):
    return SimModel() if sim else TorchModel()


def warm_up(model):
    model.warm_up()


def load_batch(model):
    return model.batch()


def activation_spike(model, x):
    """The forward pass: each block keeps its input, its wide activation
    and the activation's GELU for the backward pass."""
    for i in range(BLOCKS):
        x = model.block(i, x)
    return x


def backward_pass(model, out):
    model.backward(out)


def optimizer_step(model):
    model.step()


def training_step(model):
    x = load_batch(model)
    out = activation_spike(model, x)
    del x
    backward_pass(model, out)
    del out
    optimizer_step(model)


def main():
    model = build_model("--sim" in sys.argv[1:])
    warm_up(model)
    model.reset_peaks()
    training_step(model)
    spike = BLOCKS * (TOKENS * WIDE * FP32 * 2 + TOKENS * HIDDEN * FP32)  # h, gelu(h), and the block's output
    expect = dict(pid=os.getpid(), spike=spike, **model.stats())
    print("done", flush=True)
    print("expect " + " ".join(f"{k}={v}" for k, v in expect.items()), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
