"""A deliberate out-of-memory with PyTorch's caching allocator on.

Protocol as torch_tensors.py (no argument): after the start line, fill_memory
takes all but 6 GiB of the GPU in 4 GiB tensors, then giant_batch asks for
8 GiB more than is free; PyTorch raises OutOfMemoryError, which is caught.
Prints "done" and "expect filled=BYTES oom=1", waits for a line, exits.
"""
import os
import sys

import torch

GiB = 1 << 30
held = []


def fill_memory():
    free, _ = torch.cuda.mem_get_info()
    n = (free - 6 * GiB) // (4 * GiB)
    for _ in range(n):
        held.append(torch.empty(4 * GiB, dtype=torch.uint8, device="cuda"))
    return n * 4 * GiB


def giant_batch():
    free, _ = torch.cuda.mem_get_info()
    try:
        held.append(torch.empty(free + 8 * GiB, dtype=torch.uint8, device="cuda"))
        return 0
    except torch.OutOfMemoryError:
        return 1


def main():
    torch.cuda.init()
    torch.empty(1, device="cuda")
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    filled = fill_memory()
    oom = giant_batch()
    print("done", flush=True)
    print(f"expect filled={filled} oom={oom}", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
