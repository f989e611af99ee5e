"""PyTorch allocation sites with known sizes, for validating gpu-mem on a GPU.

Protocol as tests/workloads/simwork.py: prints "ready PID" once CUDA is
initialized, waits for a line, allocates one tensor per site and keeps them,
prints "done" and "expect SITE=BYTES ...", waits for a line, exits.

Sizes are 2 MiB multiples of at least 10 MiB, so that PyTorch's caching
allocator asks the driver for exactly that much in a segment of its own;
small_site (1000 bytes) shows the 2 MiB segment a small tensor gets.
"""
import os
import sys

import torch

MiB = 1 << 20
held = []


def small_site():
    held.append(torch.empty(1000, dtype=torch.uint8, device="cuda"))


def load_weights():
    held.append(torch.empty(12 * MiB, dtype=torch.uint8, device="cuda"))


class KVCache:
    def allocate(self):
        held.append(torch.empty(14 * MiB, dtype=torch.uint8, device="cuda"))

    @classmethod
    def build(cls):
        held.append(torch.empty(18 * MiB, dtype=torch.uint8, device="cuda"))


def outer():
    def inner():
        held.append(torch.empty(22 * MiB, dtype=torch.uint8, device="cuda"))

    inner()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # 6 * 2**20 float32 weights: 24 MiB
        self.proj = torch.nn.Linear(2048, 3072, bias=False, device="cuda")


def build_model():
    held.append(Model())


SITES = {
    "small_site": 1000,
    "load_weights": 12 * MiB,
    "KVCache.allocate": 14 * MiB,
    "KVCache.build": 18 * MiB,
    "outer.<locals>.inner": 22 * MiB,
    "Model.__init__": 24 * MiB,
}


def main():
    torch.cuda.init()
    torch.cuda.synchronize()
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    small_site()
    load_weights()
    KVCache().allocate()
    KVCache.build()
    outer()
    build_model()
    torch.cuda.synchronize()
    print("done", flush=True)
    print("expect " + " ".join(f"{k}={v}" for k, v in SITES.items()), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
