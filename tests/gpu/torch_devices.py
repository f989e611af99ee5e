"""Tensors of known sizes on cuda:0 and cuda:1, and pinned host memory, for
validating gpu-mem's per-GPU attribution on a machine with two GPUs.

Prints "expect gpu0=BYTES gpu1=BYTES host=BYTES" and exits. With WAIT=1 it
first initializes CUDA on both devices, prints "ready PID" and waits for a
line, so that gpu-mem can attach to a process whose contexts already exist.
Sizes are 2 MiB multiples of at least 10 MiB: with PyTorch's caching
allocator on, each is one segment of exactly that size.
"""
import os
import sys

import torch

MiB = 1 << 20
held = []


def place_on(device, nbytes):
    held.append(torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}"))


def pin(nbytes):
    held.append(torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))


def main():
    if os.environ.get("WAIT") == "1":
        for d in (0, 1):
            torch.cuda.init()
            torch.cuda.set_device(d)
            torch.cuda.synchronize()
        torch.cuda.set_device(0)
        print(f"ready {os.getpid()}", flush=True)
        sys.stdin.readline()
    place_on(0, 12 * MiB)
    place_on(1, 14 * MiB)
    place_on(1, 18 * MiB)
    place_on(0, 22 * MiB)
    pin(4 * MiB)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    uuid = ["GPU-" + str(torch.cuda.get_device_properties(d).uuid) for d in (0, 1)]
    print(f"uuid gpu0={uuid[0]} gpu1={uuid[1]}", flush=True)
    print(f"expect gpu0={34 * MiB} gpu1={32 * MiB} host={4 * MiB}", flush=True)
    if os.environ.get("WAIT") == "1":
        sys.stdin.readline()


if __name__ == "__main__":
    main()
