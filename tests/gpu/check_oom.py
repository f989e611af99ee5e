"""Checks gpu-mem's out-of-memory snapshot of torch_oom.py.

Usage: check_oom.py GPUMEM_JSON EXPECT_LINE
The report must hold one out-of-memory event whose failing stack's innermost
frame in torch_oom.py is giant_batch, and whose top stacks by live bytes are
fill_memory's, holding what it filled in tensors. Exits 1 otherwise.
"""
import json
import sys

report = json.load(open(sys.argv[1]))
expect = dict(kv.split("=") for kv in sys.argv[2].split()[1:])
filled = int(expect["filled"])


def where(frames):
    py = [f for f in frames if f.get("file", "").endswith("torch_oom.py")]
    return py[0]["function"] if py else "?"


ok = expect["oom"] == "1" and len(report["out_of_memory"]) == 1
for o in report["out_of_memory"]:
    f = o["failure"]
    print(f"out of memory: {f['requested_bytes']} bytes via {f['function']} from {where(f['frames'])}")
    ok = ok and where(f["frames"]) == "giant_batch"
    tensors = sum(h["live_bytes"] for h in o["held"] if h["kind"] == "tensor" and where(h["frames"]) == "fill_memory")
    for h in o["held"][:4]:
        print(f"  held {h['live_bytes']:>14} {h['kind']:8} by {where(h['frames'])}")
    print(f"  fill_memory's tensors: {tensors} bytes, filled {filled}")
    ok = ok and where(o["held"][0]["frames"]) == "fill_memory" and tensors == filled
sys.exit(0 if ok else 1)
