"""A CUDA graph captured with torch.cuda.graph (its private memory pool),
for checking that gpu-mem charges the pool's segments and tensors to the
capturing Python function.

Run it after gpumem is recording (tests/gpu/protocol.sh's record_first).
build_model makes a two-layer MLP and a static input; warmup runs it on a
side stream (as torch requires before capture); capture_step captures one
forward pass into a CUDAGraph (every allocation inside goes to the graph's
private pool); replay replays it ten times. Then reads
torch.cuda.memory_snapshot(): the private pool's segments (segment_pool_id
not (0, 0)), their total size, and the live blocks in them; and what the
default pool gained during capture_step (torch.cuda.graph registers the RNG
generator's graph state there: two 8-byte tensors). Prints "stats JSON",
"done" and "expect pool_segments=BYTES pool_active=BYTES pool_requested=BYTES
default_segments=BYTES default_requested=BYTES", waits for a line while
holding everything, exits.
"""
import json
import sys

import torch

held = {}


def build_model():
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 4096)
    ).cuda()
    x = torch.randn(512, 4096, device="cuda")
    held["model"] = (model, x)
    return model, x


def warmup(model, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)


def capture_step(model, x):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        h = model[0](x)
        y = model[2](model[1](h)) + h[:, :4096]
    held["graph"] = (g, y)
    return g


def replay(g):
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()


def default_pool():
    """The default pool's segments and live blocks, by address."""
    segs, blocks = {}, {}
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0):
            continue
        segs[seg["address"]] = seg["total_size"]
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated":
                blocks[blk["address"]] = blk.get("requested_size", blk["size"])
    return segs, blocks


def pool_summary(before):
    """The private pool's segments and live blocks, and what the default
    pool gained while capture_step ran (the generator's graph-safe state)."""
    out = {"segments": 0, "segment_bytes": 0, "active_bytes": 0, "requested_bytes": 0, "blocks": 0,
           "other_segments": 0, "other_segment_bytes": 0}
    segs, blocks = default_pool()
    out["default_new_segment_bytes"] = sum(v for k, v in segs.items() if k not in before[0])
    out["default_new_requested_bytes"] = sum(v for k, v in blocks.items() if k not in before[1])
    for seg in torch.cuda.memory_snapshot():
        pool = tuple(seg.get("segment_pool_id", (0, 0)))
        if pool == (0, 0):
            out["other_segments"] += 1
            out["other_segment_bytes"] += seg["total_size"]
            continue
        out["segments"] += 1
        out["segment_bytes"] += seg["total_size"]
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated":
                out["blocks"] += 1
                out["active_bytes"] += blk["size"]
                out["requested_bytes"] += blk.get("requested_size", blk["size"])
    return out


def main():
    model, x = build_model()
    warmup(model, x)
    torch.cuda.synchronize()
    before = default_pool()
    g = capture_step(model, x)
    pool = pool_summary(before)
    replay(g)
    try:
        graph_pool = list(g.pool())
    except Exception as e:  # noqa: BLE001
        graph_pool = str(e)
    stats = {"torch": torch.__version__, "pool": pool, "graph_pool": graph_pool,
             "memory_allocated": torch.cuda.memory_allocated(), "memory_reserved": torch.cuda.memory_reserved()}
    print("stats " + json.dumps(stats), flush=True)
    print("done", flush=True)
    print(f"expect pool_segments={pool['segment_bytes']} pool_active={pool['active_bytes']} "
          f"pool_requested={pool['requested_bytes']} default_segments={pool['default_new_segment_bytes']} "
          f"default_requested={pool['default_new_requested_bytes']}", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
