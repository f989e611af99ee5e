"""Compares gpu-mem's tensor view and graph pools with torch's own books.

Usage: check_graphs.py WHAT GPUMEM_JSON PID "live|expect tensor_live=N tensor_peak=N pool_reserved=N ..."
The tensor view of process PID in gpumem record's JSON report (its live
tensor bytes on GPU 0, and its tensor peak) against torch's requested bytes,
current and peak; and the CUDA graph pools' part of its driver view (the
live bytes of its stacks that end in the "[CUDA graph pool]" frame) against
the bytes of torch's segments in private pools (memory_snapshot()'s
segment_pool_id not (0, 0)). Prints "PASS WHAT ..." or "FAIL WHAT ..." for
each and exits 1 on a failure.
"""
import json
import sys

what, path, pid, line = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
books = dict(kv.split("=") for kv in line.split()[1:])
report = json.load(open(path))
live = sum(s["live_bytes"] for s in report["stacks"] if s["pid"] == pid and s["kind"] == "tensor" and s["gpu"] == "0")
peaks = [p["bytes"] for p in report["peaks"] if p["pid"] == pid and p["view"] == "tensor" and p["gpu"] == "0"]
peak = peaks[0] if peaks else 0
ok = live == int(books["tensor_live"]) and peak == int(books["tensor_peak"])
print(f"{'PASS' if ok else 'FAIL'} {what}: tensor view live {live} peak {peak}; "
      f"torch requested_bytes current {books['tensor_live']} peak {books['tensor_peak']}; "
      f"diff live {live - int(books['tensor_live'])} peak {peak - int(books['tensor_peak'])}")
print(f"  losses {json.dumps(report['losses'])} unknown frees {report['ledger'].get('unknown_frees', 0)} "
      f"{json.dumps(report['ledger'].get('unknown_frees_by', {}))}")
top = sorted((s for s in report["stacks"] if s["pid"] == pid and s["kind"] == "tensor" and s["live_bytes"]),
             key=lambda s: -s["live_bytes"])[:5]
for s in top:
    py = [f["function"] for f in s["frames"] if f.get("file")][:3]
    print(f"  {s['live_bytes']:>12} live in {s['live_allocations']} tensors: {' <- '.join(py) or s['frames'][0]['function']}")

GRAPH_POOL = "[CUDA graph pool]"
pools = [s for s in report["stacks"] if s["pid"] == pid and s["kind"] != "tensor" and s["gpu"] == "0" and s["live_bytes"]
         and s["frames"] and s["frames"][0]["function"] == GRAPH_POOL]
pool = sum(s["live_bytes"] for s in pools)
pool_ok = pool == int(books["pool_reserved"])
print(f"{'PASS' if pool_ok else 'FAIL'} {what} graph pool: driver view's graph pool part {pool}; "
      f"torch's private pools' segments {books['pool_reserved']} (of reserved {books['reserved']}); "
      f"diff {pool - int(books['pool_reserved'])}")
captured = {}
for s in pools:
    py = [f["function"] for f in s["frames"] if f.get("file")]
    where = next((f for f in py if f in ("CUDAGraphNode._record", "CUDAWarmupNode.run", "graph_pool_steps")), None)
    key = where or " <- ".join(py[:3]) or "(no Python frame)"
    captured[key] = captured.get(key, 0) + s["live_bytes"]
for where, nbytes in sorted(captured.items(), key=lambda kv: -kv[1]):
    print(f"  {nbytes:>12} of the graph pools captured in {where}")
if not pool_ok:  # every row of the part, to tell which allocations the difference is made of
    for s in sorted(pools, key=lambda s: -s["live_bytes"]):
        py = [f["function"] for f in s["frames"] if f.get("file")]
        print(f"    {s['live_bytes']:>12} in {s['live_allocations']}: {' <- '.join(py[:10])}")
sys.exit(0 if ok and pool_ok else 1)
