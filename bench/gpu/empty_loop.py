"""torch.empty + del of 1 MiB, 100 warm-up then 1,000 times, with the caching
allocator on: run under bench/callcount to see which probed driver functions
the loop calls (bench/gpu/RESULTS.md).

    go run ./bench/callcount LIBCUDA -- python3 bench/gpu/empty_loop.py
"""
import time

import torch

torch.cuda.init()
for _ in range(100):
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    del x
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(1000):
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    del x
torch.cuda.synchronize()
print("us per iteration", (time.perf_counter() - start) * 1e3)
