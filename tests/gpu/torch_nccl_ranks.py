"""A two-rank torch.distributed job, one process and one GPU per rank
(backend nccl), for seeing each rank's NCCL and cuBLAS driver allocations in
gpu-mem by their native stacks, per process and per GPU.

Run it after gpumem is recording (tests/gpu/protocol.sh's record_first), with
NCCL_NVLS_ENABLE=0, on a machine with two GPUs. Each rank creates its process
group on its GPU (device_id), all-reduces a 16 MiB tensor (the sum checked),
and multiplies two 4096x4096 fp16 matrices (cuBLAS). The parent prints
"stats JSON" (each rank's pid, GPU and torch counters), "done" and "expect
ranks=N", waits for a line, then lets the ranks tear down and exit.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 1 << 20
WORLD = 2


def init_nccl(rank):
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29571", rank=rank, world_size=WORLD,
                            device_id=torch.device("cuda", rank))


def allreduce(rank):
    t = torch.full((4 * MiB,), float(rank + 1), dtype=torch.float32, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    assert t[0].item() == sum(range(1, WORLD + 1)), t[0].item()
    return t


def matmul():
    a = torch.randn(4096, 4096, dtype=torch.float16, device="cuda")
    b = torch.randn(4096, 4096, dtype=torch.float16, device="cuda")
    c = a @ b
    torch.cuda.synchronize()
    return a, b, c


def rank_main(rank, results, finish):
    torch.cuda.set_device(rank)
    init_nccl(rank)
    held = [allreduce(rank), *matmul()]
    free, total = torch.cuda.mem_get_info()
    results.put({
        "rank": rank, "pid": os.getpid(), "gpu": rank,
        "memory_allocated": torch.cuda.memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "device_used": total - free,
        "held_bytes": sum(t.nbytes for t in held),
    })
    finish.wait()
    dist.destroy_process_group()


def main():
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "keep NCCL_NVLS_ENABLE=0"
    assert torch.cuda.device_count() >= WORLD, f"needs {WORLD} GPUs"
    ctx = mp.get_context("spawn")
    results, finish = ctx.Queue(), ctx.Event()
    ranks = [ctx.Process(target=rank_main, args=(r, results, finish)) for r in range(WORLD)]
    for p in ranks:
        p.start()
    stats = sorted((results.get(timeout=240) for _ in ranks), key=lambda s: s["rank"])
    print("stats " + json.dumps({"ranks": stats, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}), flush=True)
    print("done", flush=True)
    print(f"expect ranks={WORLD}", flush=True)
    sys.stdin.readline()
    finish.set()
    for p in ranks:
        p.join()
        assert p.exitcode == 0, p.exitcode


if __name__ == "__main__":
    main()
