"""The cost of the tensor view, measured inside one process.

A loop of torch.empty(1 MiB) + del runs at about 2.5 or about 4.5 us per
iteration from one process to the next on the GPU machine, whatever the
profiler: too much noise to see a few microseconds between processes. So this
script measures, in one process, phases the harness (bench/gpu/run.sh) sets
up between them, each profiled phase between two "base" phases (no
profiler), so that the process's drift falls on both sides: "floor" (empty
programs on the same USDT sites: the traps alone, bench/usdtfloor),
"gpumem" (gpumem record attached to this process, its USDT probes firing on
every empty and del), "gpumem_native" (the same with
--tensor-native-stacks), then "history" (PyTorch's own
_record_memory_history, which stays on: last). Each phase first runs the
loop for two seconds, so that a profiler's start (symbol tables read, the
loop's stacks named) is over before the measurement. Protocol: prints "ready PID", then before each
phase "phase NAME" and waits for a line; prints "result phase=NAME
us_per_empty=..." (best of 5 runs of 20000) after each; exits.
"""
import os
import sys
import time

import torch

from torch_bench import empty_and_del  # the same loop as the table above it


PHASES = ("base", "floor", "base", "gpumem", "base", "gpumem_native", "base", "history")


def phase(name):
    print(f"phase {name}", flush=True)
    sys.stdin.readline()
    if name == "history":
        torch.cuda.memory._record_memory_history(max_entries=100000)
    warm = time.perf_counter() + 2
    while time.perf_counter() < warm:
        empty_and_del(1000)
    best = min(empty_and_del(20000) for _ in range(5))
    print(f"result phase={name} us_per_empty={best:.3f}", flush=True)


def main():
    torch.cuda.init()
    empty_and_del(200)
    print(f"ready {os.getpid()}", flush=True)
    for name in PHASES:
        phase(name)


if __name__ == "__main__":
    main()
