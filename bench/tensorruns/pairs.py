"""Tensor allocations and frees on the simulated allocator, from Python at a
chosen stack depth: the load bench/tensorruns/run.sh measures the tensor
program's run time under.

Usage: pairs.py DEPTH (N pairs from the environment, default 100000).
PAIRS_STACK says how the DEPTH frames are called: plain (Python calling
Python, the default), nested (each through a __call__, as nn.Module's:
a shim frame on the C stack each, as a real model's stacks have), or
after-nested (plain, once 1000 pairs were made 10 __call__s deep).
PAIRS_TOUCH (bytes, default 0) is written after each allocation and each
free, so that the programs find the caches and the TLB as cold as a real
workload leaves them between two tensors (as in torch's process on the GPU
machine); the pairs' own time then means nothing, only
the programs' run time does. PAIRS_WORK (default 0) runs that many rounds
of a long and varied code path (json, re, sorting: much of the
interpreter's and its libraries' code) after each allocation and each
free, as a model's code runs between two tensors, so that felt.sh's time a
pair tells what a pair costs the code around it, its instruction caches
included.
Prints "ready PID", waits for a line, makes one pair and waits 2 s (the
agent attaches the allocator's probes at the process's first driver call),
then makes N pairs at DEPTH Python frames and prints "ns_per_pair X".
"""
import ctypes
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../tests/workloads"))
import simwork  # noqa: E402


TOUCH = int(os.environ.get("PAIRS_TOUCH", "0"))
touched = ctypes.create_string_buffer(max(TOUCH, 1))  # what a workload does between two probes
WORK = int(os.environ.get("PAIRS_WORK", "0"))
RECORD = {"layers": [{"name": f"layer{i}", "shape": [i, 2 * i], "dtype": "bf16"} for i in range(8)]}


def work():
    for _ in range(WORK):
        text = json.dumps(RECORD)
        names = re.findall(r"layer\d+", text)
        sorted(json.loads(text)["layers"], key=lambda layer: layer["shape"][1], reverse=True)
        "-".join(names).upper().split("-")


def pairs(n):
    p = ctypes.c_void_p()
    start = time.perf_counter()
    for _ in range(n):
        simwork.torch.simtorch_malloc(0, 4096, ctypes.byref(p))
        if TOUCH:
            ctypes.memset(touched, 1, TOUCH)
        work()
        simwork.torch.simtorch_free(p)
        if TOUCH:
            ctypes.memset(touched, 2, TOUCH)
        work()
    return time.perf_counter() - start


def plain(depth, n):
    return pairs(n) if depth <= 1 else plain(depth - 1, n)


class Nested:
    def __call__(self, depth, n):
        return pairs(n) if depth <= 1 else self(depth - 1, n)


def at_depth(depth, n):
    stack = os.environ.get("PAIRS_STACK", "plain")
    if stack == "nested":
        return Nested()(depth, n)
    if stack == "after-nested":
        Nested()(10, 1000)
    elif stack != "plain":
        sys.exit(f"PAIRS_STACK={stack}: want plain, nested or after-nested")
    return plain(depth, n)


def main():
    depth, n = int(sys.argv[1]), int(os.environ.get("N", "100000"))
    simwork.load_driver()
    simwork.load_allocator()
    print("ready", os.getpid(), flush=True)
    sys.stdin.readline()
    at_depth(depth, 1)
    time.sleep(2)
    print("ns_per_pair", at_depth(depth, n) / n * 1e9, flush=True)


main()
