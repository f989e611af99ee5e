"""What one tensor allocation and free costs the thread that makes them, in
windows a second apart in one process, for bench/gpu/pair_cost.sh: the
modes (no tensor probes, the floor's empty programs, the tensor view) are
switched between windows while the agent runs, so that the machine's drift
from minute to minute, larger than what the tensor view adds, falls out of
each round's differences.

Protocol: prints "ready PID"; then, for each line MODE read, measures the
pairs at depth 5, prints "half mode=MODE", waits for a line (so that the
caller can read the programs' run time between the depths), measures at
depth 40 and prints "result mode=MODE us_d5=X us_d40=Y": the median over 5
runs of EMPTIES (default 2000) torch.empty(1 MiB) + del, with the Python
stack 5 and 40 frames deep, in microseconds a pair. PAIR_ALLOCATOR=sim
makes the pairs on the simulated allocator (build/sim) instead of
torch's, for a machine without a GPU. MODEL_CPU pins the measuring thread to one CPU.
"""
import os
import sys
import time

from depth import at_depth, median_at_depth

EMPTIES = int(os.environ.get("EMPTIES", "2000"))


def torch_pairs():
    import torch
    from torch_bench import empty_and_del

    torch.empty(1, device="cuda")
    return empty_and_del


def sim_pairs():
    import ctypes

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../tests/workloads"))
    import simwork

    simwork.load_driver()
    simwork.load_allocator()
    p = ctypes.c_void_p()

    def pairs(n):
        start = time.perf_counter()
        for _ in range(n):
            simwork.torch.simtorch_malloc(0, 1 << 20, ctypes.byref(p))
            simwork.torch.simtorch_free(p)
        return (time.perf_counter() - start) / n * 1e6

    return pairs


def us_a_pair(depth, pairs):
    at_depth(depth, pairs, EMPTIES)  # warm-up under this mode
    return median_at_depth(depth, pairs, EMPTIES)


def main():
    pairs = sim_pairs() if os.environ.get("PAIR_ALLOCATOR") == "sim" else torch_pairs()
    pairs(10)
    if "MODEL_CPU" in os.environ:
        os.sched_setaffinity(0, {int(os.environ["MODEL_CPU"])})
    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        mode = line.strip()
        d5 = us_a_pair(5, pairs)
        print(f"half mode={mode}", flush=True)
        sys.stdin.readline()
        d40 = us_a_pair(40, pairs)
        print(f"result mode={mode} us_d5={d5:.3f} us_d40={d40:.3f}", flush=True)


if __name__ == "__main__":
    main()
