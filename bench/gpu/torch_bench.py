"""PyTorch costs with and without a memory profiler, for bench/gpu/run.sh.

Usage: torch_bench.py none|gpumem|history
'history' turns on PyTorch's own torch.cuda.memory._record_memory_history();
'gpumem' expects to run under gpumem (it changes nothing itself). Prints one
line: "result profiler=... caching=0|1 us_per_empty=... ms_per_step=...",
each the best of 5 repeats: on this machine where a thread runs moves a loop
of torch.empty by up to 2x between runs, more than any profiler does.
"""
import os
import sys
import time

import torch

caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1"


def empty_and_del(n):
    """torch.empty of 1 MiB then del, n times: the allocator's hot path."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        del x
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def model_step_ms(steps):
    """A small transformer's training step: forward, backward, optimizer."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 256, 512, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    profiler = sys.argv[1]
    torch.cuda.init()
    if profiler == "history":
        torch.cuda.memory._record_memory_history(max_entries=100000)
    n = 20000 if caching else 2000
    empty_and_del(200)  # warm up
    empties = [empty_and_del(n) for _ in range(5)]
    steps = [model_step_ms(10) for _ in range(5)]
    print(f"result profiler={profiler} caching={int(caching)} "
          f"us_per_empty={min(empties):.2f} ms_per_step={min(steps):.2f}", flush=True)


if __name__ == "__main__":
    main()
