"""Compares gpu-mem's JSON with what torch_devices.py allocated, per GPU.

Usage: check_devices.py GPUMEM_JSON EXPECT_LINE [UUID_LINE]
Sums the allocated bytes of the stacks that pass through torch_devices.py,
per gpu label, and exits 1 on a mismatch, or when a stack's gpu_uuid is not
the UUID PyTorch gives its device.
"""
import json
import sys

report = json.load(open(sys.argv[1]))
expect = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[2].split()[1:])}

uuids = dict(kv.split("=") for kv in sys.argv[3].split()[1:]) if len(sys.argv) > 3 else {}

ok = True
allocated = {}
for stack in report["stacks"]:
    if not any(f.get("file", "").endswith("torch_devices.py") for f in stack["frames"]):
        continue
    label = "gpu" + stack["gpu"] if stack["gpu"].isdigit() else stack["gpu"]
    allocated[label] = allocated.get(label, 0) + stack["allocated_bytes"]
    if label in uuids and stack.get("gpu_uuid") != uuids[label]:
        ok = False
        print(f"{label}: gpu_uuid {stack.get('gpu_uuid')!r}, PyTorch says {uuids[label]}")
    if label in uuids:
        print(f"{label}: {stack.get('gpu_name')} {stack.get('gpu_uuid')} {stack.get('gpu_bus')}")

for label in sorted(set(expect) | set(allocated)):
    got, want = allocated.get(label, 0), expect.get(label, 0)
    ok = ok and got == want
    print(f"{label:10} {got:>12} bytes allocated, want {want:>12}  {'ok' if got == want else 'MISMATCH'}")
print("python:", json.dumps(report["python"]), "losses:", json.dumps(report["losses"]))
sys.exit(0 if ok else 1)
