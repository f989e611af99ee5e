"""Checks gpumem record's breakdown (JSON) against what torch_breakdown.py
said PyTorch and NVML hold. Prints PASS or FAIL per check and the numbers.

Usage: check_breakdown.py RECORD.json WORKLOAD.stdout
"""
import json
import sys

MiB = 1 << 20
failed = False


def check(name, ok, detail):
    global failed
    failed |= not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")


def main():
    report = json.load(open(sys.argv[1]))
    expect = next(json.loads(line[len("expect "):]) for line in open(sys.argv[2]) if line.startswith("expect "))
    mode = expect["mode"]
    mine = [b for b in report["breakdown"] if b["pid"] == expect["pid"]]
    check(f"{mode}: a breakdown of the process", len(mine) == 1, f"{len(mine)} entries")
    if not mine:
        return 1
    b = mine[0]
    parts = {p["category"] + ("/" + p["library"] if p.get("library") else ""): p["bytes"] for p in b["categories"]}
    print(f"{mode}: breakdown {json.dumps(parts)}; fragmentation {b['fragmentation']}")
    print(f"{mode}: torch {json.dumps({k: v for k, v in expect.items() if k not in ('pid', 'mode')})}")
    for category in ("parameters", "gradients", "optimizer_state", "kv_cache", "cuda_graph_pools"):
        if category in expect:
            check(f"{mode}: {category} = PyTorch's", parts.get(category, 0) == expect[category],
                  f"{parts.get(category, 0)} vs {expect[category]}")
    if expect["nvml"] >= 0:
        check(f"{mode}: the parts sum to nvidia-smi's number within 1 MiB", b["nvml"] and abs(b["bytes"] - expect["nvml"]) <= MiB,
              f"{b['bytes']} vs {expect['nvml']} (nvml {b['nvml']})")
    tensors = sum(v for k, v in parts.items() if k in ("parameters", "gradients", "optimizer_state", "kv_cache", "activations"))
    if not mode.startswith("oom"):
        # a CUDA graph pool is one part, whole: its segments and the tensors in them
        outside = expect["requested"] - expect["requested_in_pools"]
        check(f"{mode}: the tensors = PyTorch's requested bytes outside graph pools", tensors == outside,
              f"{tensors} vs {expect['requested']} - {expect['requested_in_pools']}")
        cache = expect["reserved"] - expect["graph_pools"] - outside
        check(f"{mode}: allocator_cache = reserved - graph pools - requested outside them", parts.get("allocator_cache", 0) == cache,
              f"{parts.get('allocator_cache', 0)} vs {expect['reserved']} - {expect['graph_pools']} - {outside}")
        f = b["fragmentation"] or {}
        rounding = expect["allocated"] - expect["requested"]
        check(f"{mode}: free in segments = torch's inactive blocks + its rounding of live blocks",
              f.get("free_in_segments_bytes") == expect["inactive"] + rounding,
              f"{f.get('free_in_segments_bytes')} vs {expect['inactive']} + {rounding}")
        check(f"{mode}: largest free block = torch's largest inactive block, within 1 MiB",
              abs(f.get("largest_free_block_bytes", -MiB - 1) - expect["largest_inactive"]) <= MiB,
              f"{f.get('largest_free_block_bytes')} vs {expect['largest_inactive']}")
    if mode.startswith("oom"):
        ooms = [o for o in report["out_of_memory"] if o["failure"]["pid"] == expect["pid"]]
        check(f"{mode}: one out-of-memory", len(ooms) == 1, f"{len(ooms)}: {expect.get('oom_message')}")
        if ooms:
            o = ooms[0]
            want = {"oom_demand": "demand", "oom_fragment": "fragmentation", "oom_limit": "limit"}[mode]
            check(f"{mode}: verdict {want}", o.get("verdict") == want, f"{o.get('verdict')}: {o.get('why')}")
            check(f"{mode}: asked = torch's", o.get("asked_bytes") == expect["asked"], f"{o.get('asked_bytes')} vs {expect['asked']}")
            free = (o.get("fragmentation") or {}).get("free_in_segments_bytes")
            check(f"{mode}: free in the cache = torch's reserved but unallocated, within 1 MiB",
                  free is not None and abs(free - expect["reserved_unallocated"]) <= MiB, f"{free} vs {expect['reserved_unallocated']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
