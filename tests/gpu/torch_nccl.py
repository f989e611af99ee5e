"""A torch.distributed job on one GPU (backend nccl, world_size 1) and a
cuBLAS matmul, for seeing NCCL's and cuBLAS's own driver allocations in
gpu-mem by their native stacks.

Run it after gpumem is recording (tests/gpu/protocol.sh's record_first), with
NCCL_NVLS_ENABLE=0. init_nccl creates the process group with device_id (so
the communicator is made there, eagerly), allreduce sums a 16 MiB tensor,
matmul multiplies two 4096x4096 fp16 matrices (cuBLAS, its workspace). At the
known point prints "stats JSON" (torch's counters, NCCL's version),
"done" and "expect FUNCTION=BYTES ..." (the bytes of the tensors each
function holds), waits for a line, destroys the process group, exits.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

MiB = 1 << 20
held = {}


def keep(name, *tensors):
    held.setdefault(name, []).extend(tensors)


def init_nccl():
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29561", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))


def allreduce():
    t = torch.ones(4 * MiB, dtype=torch.float32, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    assert t[0].item() == 1.0
    keep("allreduce", t)


def matmul():
    a = torch.randn(4096, 4096, dtype=torch.float16, device="cuda")
    b = torch.randn(4096, 4096, dtype=torch.float16, device="cuda")
    c = a @ b
    torch.cuda.synchronize()
    keep("matmul", a, b, c)


def main():
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "keep NCCL_NVLS_ENABLE=0"
    init_nccl()
    allreduce()
    matmul()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    ms = torch.cuda.memory_stats()
    stats = {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "memory_allocated": torch.cuda.memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "device_used": total - free,
        "num_device_alloc": ms.get("num_device_alloc"),
        "num_device_free": ms.get("num_device_free"),
        "held_bytes": sum(t.nbytes for ts in held.values() for t in ts),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL", "CUBLAS"))},
    }
    print("stats " + json.dumps(stats), flush=True)
    print("done", flush=True)
    print("expect " + " ".join(f"{k}={sum(t.nbytes for t in v)}" for k, v in held.items()), flush=True)
    sys.stdin.readline()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
