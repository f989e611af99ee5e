"""Compares gpu-mem's JSON with what torch_devices.py allocated, per GPU.

Usage: check_devices.py GPUMEM_JSON EXPECT_LINE
Sums the allocated bytes of the stacks that pass through torch_devices.py,
per gpu label, and exits 1 on a mismatch.
"""
import json
import sys

report = json.load(open(sys.argv[1]))
expect = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[2].split()[1:])}

allocated = {}
for stack in report["stacks"]:
    if not any(f.get("file", "").endswith("torch_devices.py") for f in stack["frames"]):
        continue
    label = "gpu" + stack["gpu"] if stack["gpu"].isdigit() else stack["gpu"]
    allocated[label] = allocated.get(label, 0) + stack["allocated_bytes"]

ok = True
for label in sorted(set(expect) | set(allocated)):
    got, want = allocated.get(label, 0), expect.get(label, 0)
    ok = ok and got == want
    print(f"{label:10} {got:>12} bytes allocated, want {want:>12}  {'ok' if got == want else 'MISMATCH'}")
print("python:", json.dumps(report["python"]), "losses:", json.dumps(report["losses"]))
sys.exit(0 if ok else 1)
