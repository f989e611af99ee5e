"""Compares gpu-mem's tensor view with torch.cuda.memory._snapshot().

Usage: check_tensors.py GPUMEM_JSON SNAPSHOT_JSON
Both are summed per innermost frame in torch_tensors.py, keyed by its line.
Prints one line per frame, the share of the snapshot's bytes that gpu-mem
put under the same frame, and exits 1 below 99%.
"""
import json
import sys

report = json.load(open(sys.argv[1]))
snapshot = json.load(open(sys.argv[2]))

mine = {}
for stack in report["stacks"]:
    if stack["kind"] != "tensor" or stack["live_bytes"] == 0:
        continue
    py = [f for f in stack["frames"] if f.get("file", "").endswith("torch_tensors.py")]
    key = str(py[0]["line"]) if py else "elsewhere"
    m = mine.setdefault(key, {"function": py[0]["function"] if py else "", "bytes": 0, "tensors": 0})
    m["bytes"] += stack["live_bytes"]
    m["tensors"] += stack["live_allocations"]

for field in ("size", "requested"):
    total = sum(s[field] for s in snapshot.values())
    matched = sum(min(s[field], mine.get(k, {}).get("bytes", 0)) for k, s in snapshot.items())
    print(f"against the snapshot's {field}: {matched} of {total} bytes under the same frame ({100 * matched / max(total, 1):.3f}%)")
print(f"{'line':>6} {'function':28} {'gpu-mem bytes':>14} {'tensors':>8} {'snapshot size':>14} {'requested':>12} {'blocks':>7}")
for key in sorted(set(mine) | set(snapshot), key=lambda k: (k == "elsewhere", int(k) if k.isdigit() else 0)):
    m, s = mine.get(key, {}), snapshot.get(key, {})
    print(f"{key:>6} {(m.get('function') or s.get('function', '')):28} {m.get('bytes', 0):>14} {m.get('tensors', 0):>8} "
          f"{s.get('size', 0):>14} {s.get('requested', 0):>12} {s.get('blocks', 0):>7}")
total = sum(s["size"] for s in snapshot.values())
matched = sum(min(s["size"], mine.get(k, {}).get("bytes", 0)) for k, s in snapshot.items())
print("python:", json.dumps(report["python"]), "losses:", json.dumps(report["losses"]))
sys.exit(0 if matched >= 0.99 * total else 1)
