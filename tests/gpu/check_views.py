"""Checks gpu-mem's two views of torch_views.py against PyTorch's own account
(issue 18): the driver view (every kind but tensor: what the GPU holds) and
the tensor view (kind tensor), each summed apart, never together.

Usage: check_views.py GPUMEM_JSON WORKLOAD_STDOUT
GPUMEM_JSON is `gpumem record --format json` of the run; WORKLOAD_STDOUT has
torch_views.py's "functions {JSON}" and "expect k=v ..." lines.

Exact, or the check fails (exit 1):
- the tensor view of the process on its GPU = memory_stats()'s
  requested_bytes.all.current, and = torch.cuda.memory_allocated();
- the driver view under PyTorch's caching allocator (driver rows whose stack
  passes through c10::cuda::CUDACachingAllocator, as the HTML report's
  "allocator segments") = torch.cuda.memory_reserved();
- the driver bytes under library_workspace = its cuMemAlloc_v2 (6 MiB);
- per GPUModelRunner method, its tensors = the growth of requested bytes
  during it, and its allocator segments = the growth of memory_reserved();
- the driver view's process total on the GPU = memory_reserved() + the
  workspace + the rest, listed by the native frame that called the driver
  (cuBLAS's handle, ...), and no more than the device's used memory grew
  since the CUDA context was made (what the driver holds for the process
  besides: the context's own growth, modules loaded lazily, untraced).
nvidia-smi's per-process figure is printed beside it.
"""
import json
import sys

ALLOCATOR = "CUDACachingAllocator::"  # report/views.go's AllocatorSegment
MiB = 1 << 20

report = json.load(open(sys.argv[1]))
expect, functions = {}, {}
for line in open(sys.argv[2]):
    if line.startswith("expect "):
        expect = {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    elif line.startswith("functions "):
        functions = json.loads(line[len("functions "):])
if not expect:
    sys.exit("no expect line in " + sys.argv[2])
pid = expect["pid"]


def segment(stack):
    return any(ALLOCATOR in f["function"] for f in stack["frames"])


def owner(stack):
    """The workload's function a stack is under: the innermost
    GPUModelRunner method (a comprehension in it, 3.11's
    GPUModelRunner.execute_model.<locals>.<listcomp>, is under it) or
    library_workspace."""
    for f in stack["frames"]:
        name = f["function"].split(".<locals>.")[0]
        if name.startswith("GPUModelRunner.") or name == "library_workspace":
            return name
    return "elsewhere"


def caller(stack):
    """The native frame that called the driver, for the rest of the driver
    view."""
    frames = stack["frames"]
    return frames[1]["function"] if len(frames) > 1 else frames[0]["function"] if frames else "?"


mine = [s for s in report["stacks"] if s["pid"] == pid and s["live_bytes"] > 0]
tensors = [s for s in mine if s["kind"] == "tensor"]
gpus = sorted({s["gpu"] for s in tensors}) or sorted({s["gpu"] for s in mine})
gpu = gpus[0] if gpus else "0"
driver = [s for s in mine if s["kind"] != "tensor" and s["gpu"] == gpu]
elsewhere = [s for s in mine if s["kind"] != "tensor" and s["gpu"] != gpu]

tensor_total = sum(s["live_bytes"] for s in tensors if s["gpu"] == gpu)
driver_total = sum(s["live_bytes"] for s in driver)
segments = sum(s["live_bytes"] for s in driver if segment(s))
workspace = sum(s["live_bytes"] for s in driver if owner(s) == "library_workspace" and not segment(s))
rest = {}
for s in driver:
    if not segment(s) and owner(s) != "library_workspace":
        rest[caller(s)] = rest.get(caller(s), 0) + s["live_bytes"]
grown = expect["device_used"] - expect["device_used_at_start"]

failed = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failed.append(name)


print(f"pid {pid} on gpu {gpu}: driver view {driver_total}, tensor view {tensor_total} (never added); "
      f"allocator segments {segments}, allocator cache {segments - tensor_total} (segments - tensors)")
check("tensor view = requested_bytes", tensor_total == expect["requested"],
      f"{tensor_total} against {expect['requested']}")
check("tensor view = memory_allocated()", tensor_total == expect["allocated"],
      f"{tensor_total} against {expect['allocated']} (512-byte blocks; a large block left unsplit counts whole)")
check("allocator segments = memory_reserved()", segments == expect["reserved"],
      f"{segments} against {expect['reserved']}")
check("library_workspace = its cuMemAlloc_v2", workspace == expect["workspace"],
      f"{workspace} against {expect['workspace']}")
for name, f in sorted(functions.items()):
    t = sum(s["live_bytes"] for s in tensors if owner(s) == name)
    seg = sum(s["live_bytes"] for s in driver if segment(s) and owner(s) == name)
    check(f"{name} tensors", t == f["requested"], f"{t} against requested growth {f['requested']}")
    check(f"{name} segments", seg == f["reserved"], f"{seg} against memory_reserved() growth {f['reserved']}")
accounted = expect["reserved"] + expect["workspace"] + sum(rest.values())
check("driver view = memory_reserved() + workspace + the rest", driver_total == accounted,
      f"{driver_total} = {expect['reserved']} + {expect['workspace']} + {sum(rest.values())}: "
      + ", ".join(f"{k} {v}" for k, v in sorted(rest.items(), key=lambda kv: -kv[1])))
check("driver view <= device memory grown since the context", driver_total <= grown,
      f"{driver_total} of {grown} ({grown - driver_total} bytes the driver holds for the process untraced: "
      "the context's growth, modules loaded lazily)")
if "smi_used_mib" in expect:
    print(f"nvidia-smi: the process uses {expect['smi_used_mib']} MiB; the driver view {driver_total / MiB:.1f} MiB, "
          f"the device grew by {grown / MiB:.1f} MiB since the context, which took {expect['device_used_at_start'] / MiB:.1f} MiB "
          "(with what else was on the device)")
if elsewhere:
    print("driver view on other GPUs:", {s["gpu"]: s["live_bytes"] for s in elsewhere})
print("python:", json.dumps(report["python"]), "losses:", json.dumps(report["losses"]),
      "unknown frees:", report["ledger"].get("unknown_frees"))
sys.exit(1 if failed else 0)
