"""Tensors with PyTorch's caching allocator on, for validating gpu-mem's
tensor view on a GPU against PyTorch's own account.

Usage: torch_tensors.py SNAPSHOT_JSON
Protocol as tests/workloads/simwork.py: prints "ready PID" once CUDA is
initialized, waits for a line, allocates from several functions (keeping
some tensors, dropping others), then takes torch.cuda.memory._snapshot() and
writes, per innermost frame in this file (by line), the bytes of its live
blocks: "size" (the allocator's block) and "requested" (the tensor's own).
Prints "done" and "expect ...", waits for a line while holding everything,
exits. Memory history is recorded from the start, so that the snapshot has
the stack of every block; gpu-mem is read while the script waits.
"""
import json
import os
import sys

import torch

MiB = 1 << 20
HERE = os.path.abspath(__file__)
held = []


def load_weights():
    for _ in range(4):
        held.append(torch.empty(50 * MiB, dtype=torch.uint8, device="cuda"))


def kv_cache():
    held.append(torch.zeros(8, 1024, 1024, dtype=torch.float16, device="cuda"))


def activations():
    acts = [torch.empty(300_000, dtype=torch.uint8, device="cuda") for _ in range(40)]
    held.extend(acts[::4])


def small_buffers():
    for i in range(100):
        held.append(torch.empty(1000 + i, dtype=torch.uint8, device="cuda"))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(1024, 4096, device="cuda")
        self.down = torch.nn.Linear(4096, 1024, device="cuda")

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def build_model():
    model = Block()
    held.append(model)
    return model


def forward_pass(model):
    x = torch.randn(64, 1024, device="cuda")
    with torch.no_grad():
        held.append(model(x))


def summarize(snapshot):
    """Bytes of live blocks per innermost frame of this file, by line."""
    out = {}
    for seg in snapshot["segments"]:
        for blk in seg["blocks"]:
            if blk["state"] != "active_allocated":
                continue
            mine = [f for f in blk.get("frames", []) if os.path.abspath(f["filename"]) == HERE]
            key = str(mine[0]["line"]) if mine else "elsewhere"
            s = out.setdefault(key, {"function": mine[0]["name"] if mine else "", "size": 0, "requested": 0, "blocks": 0})
            s["size"] += blk["size"]
            s["requested"] += blk.get("requested_size", blk["size"])
            s["blocks"] += 1
    return out


def main():
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    torch.empty(1, device="cuda")  # the context, before gpu-mem starts
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    load_weights()
    kv_cache()
    activations()
    small_buffers()
    forward_pass(build_model())
    torch.cuda.synchronize()
    summary = summarize(torch.cuda.memory._snapshot())
    with open(sys.argv[1], "w") as f:
        json.dump(summary, f, indent=1)
    print("done", flush=True)
    print("expect blocks=%d" % sum(s["blocks"] for s in summary.values()), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
