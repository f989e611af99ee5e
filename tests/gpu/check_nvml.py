"""nvidia-smi's per-process numbers against gpu-mem's (issue 31).

Usage: check_nvml.py GPUMEM OUTDIR [NVML_LIBRARY]
Starts `GPUMEM record --format json` of every process (the profiler first,
as a node's agent is), then, at once on one GPU: the vLLM-shaped runner
(torch_views.py), a real transformers model with cuBLAS and cuDNN
(nvml_hold.py model), the same with CUDA_MODULE_LOADING=EAGER, JAX
(nvml_hold.py jax), and torch loading a 64 MiB module through
cuModuleLoadData, eagerly and lazily (nvml_hold.py modules). Once each holds its memory, stops the recorder (its
report: OUTDIR/nvml.json, its log OUTDIR/nvml.stderr), reads
nvidia-smi --query-compute-apps=pid,used_memory and memory.used, and
compares, printing PASS or FAIL lines:
- per workload process: nvidia-smi's used_memory (MiB) against gpu-mem's
  driver view of the process on the GPU (its stacks' live bytes: device,
  VMM, context and driver-internal rows), within 1 MiB; and gpu-mem's NVML
  number (gpus[].processes[].nvml_bytes) against nvidia-smi's;
- each made its context while traced: a context part above 0, charged to
  a stack through cuDevicePrimaryCtxRetain or cuCtxCreate;
- with CUDA_MODULE_LOADING=EAGER, the module's load charged (a row of kind
  module of at least its 64 MiB __device__ array, on a stack through
  cuModuleLoadData and load_module), and module_bytes the same;
- the GPU: nvidia-smi's memory.used against gpu-mem's gpus[].used_bytes,
  within 1 MiB, and against the sum of its rows on the GPU (all
  processes, traced or not) plus not_of_processes_bytes.
Prints each process's parts (traced, contexts, modules, kernel images and
driver internals), lazy against eager (lazily, the module's images load at
a kernel's first launch, not in cuModuleLoadData: they stay in
driver-internal; its __device__ array may or may not). NVML_LIBRARY: where libnvidia-ml.so.1 is
(default: found through nvidia-ml-py's own load, /proc/self/maps).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

MiB = 1 << 20
here = os.path.dirname(os.path.abspath(__file__))
gpumem, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
failed = False


def check(ok, what):
    global failed
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    failed |= not ok


def nvml_library():
    if len(sys.argv) > 3:
        return sys.argv[3]
    import pynvml
    pynvml.nvmlInit()
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "libnvidia-ml.so" in path:
            return path
    return "libnvidia-ml.so.1"


def smi(query, *flags):
    res = subprocess.run(["nvidia-smi", "--query-" + query, "--format=csv,noheader,nounits", *flags],
                         capture_output=True, text=True, check=True)
    return [[f.strip() for f in line.split(",")] for line in res.stdout.strip().splitlines() if line.strip()]


lib = nvml_library()
print(f"NVML: {lib}", flush=True)
log = open(os.path.join(out, "nvml.stderr"), "w")
report = os.path.join(out, "nvml.json")
rec = subprocess.Popen([gpumem, "record", "--format", "json", "-o", report, "--top", "0", "--nvml-library", lib],
                       stderr=subprocess.PIPE, text=True)
lines = []
for line in rec.stderr:
    log.write(line)
    lines.append(line)
    if "recording" in line:
        break
drain = threading.Thread(target=lambda: [log.write(l) for l in rec.stderr])  # gpumem never blocks on its log
drain.start()

env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
workloads = {
    "runner": ([sys.executable, os.path.join(here, "torch_views.py")], {}),
    "model (lazy)": ([sys.executable, os.path.join(here, "nvml_hold.py"), "model"], {}),
    "model (eager)": ([sys.executable, os.path.join(here, "nvml_hold.py"), "model"], {"CUDA_MODULE_LOADING": "EAGER"}),
    "jax": ([sys.executable, os.path.join(here, "nvml_hold.py"), "jax"], {}),
    "modules (eager)": ([sys.executable, os.path.join(here, "nvml_hold.py"), "modules"], {"CUDA_MODULE_LOADING": "EAGER"}),
    "modules (lazy)": ([sys.executable, os.path.join(here, "nvml_hold.py"), "modules"], {}),
}
procs = {}
for name, (cmd, extra) in workloads.items():
    procs[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env=dict(env, **extra))
pids = {}
for name, p in procs.items():
    for line in p.stdout:
        if line.startswith("expect "):
            pids[name] = int(dict(kv.split("=") for kv in line.split()[1:])["pid"])
            break
    else:
        check(False, f"{name} ended before holding its memory")
time.sleep(2)  # a scan and an NVML read after the last allocation
apps = {int(pid): int(mib) for pid, mib in smi("compute-apps=pid,used_memory")}
used_mib = int(smi("gpu=memory.used", "-i", "0")[0][0])
rec.send_signal(signal.SIGINT)
rec.wait()
drain.join()
log.close()
# NVML is loaded at the profiler's first reading, after "recording": the whole log says it.
said = [l for l in open(os.path.join(out, "nvml.stderr")) if "NVML" in l]
check(any("NVML: driver" in l for l in said), "gpumem read NVML: " + "".join(said).strip())
apps_after = {int(pid): int(mib) for pid, mib in smi("compute-apps=pid,used_memory")}
for p in procs.values():
    p.stdin.write("\n")
    p.stdin.flush()
for p in procs.values():
    p.wait()

r = json.load(open(report))
gpu = r["gpus"][0] if r.get("gpus") else None
check(gpu is not None, "gpu-mem's report has NVML's numbers (gpus)")
if gpu is None:
    sys.exit(1)
listed = {p["pid"]: p for p in gpu["processes"]}
for name, pid in pids.items():
    rows = [s for s in r["stacks"] if s["pid"] == pid and s["kind"] != "tensor" and s["gpu"] not in ("host", "managed")]
    total = sum(s["live_bytes"] for s in rows)
    parts = {}
    for s in rows:
        parts[s["kind"]] = parts.get(s["kind"], 0) + s["live_bytes"]
    smi_bytes = apps.get(pid, 0) * MiB
    print(f"{name} pid {pid}: nvidia-smi {apps.get(pid)} MiB (after the report: {apps_after.get(pid)} MiB); gpu-mem "
          + ", ".join(f"{k} {v / MiB:.1f} MiB" for k, v in sorted(parts.items())), flush=True)
    check(abs(total - smi_bytes) <= MiB, f"{name}: gpu-mem's driver view {total} B = nvidia-smi's {smi_bytes} B within 1 MiB")
    p = listed.get(pid)
    check(p is not None and abs(p["nvml_bytes"] - smi_bytes) <= MiB,
          f"{name}: gpu-mem's NVML number {p and p['nvml_bytes']} B = nvidia-smi's within 1 MiB")
    contexts = [s for s in rows if s["kind"] == "context"]
    check(parts.get("context", 0) > 0 and all(
        any(f["function"] in ("cuDevicePrimaryCtxRetain", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4")
            for f in s["frames"]) for s in contexts),
          f"{name}: its context ({parts.get('context', 0) / MiB:.1f} MiB) charged to the stack that made it")
if "modules (eager)" in pids:
    pid = pids["modules (eager)"]
    mods = [s for s in r["stacks"] if s["pid"] == pid and s["kind"] == "module"]
    loaded = sum(s["live_bytes"] for s in mods)
    check(loaded >= 64 * MiB and any(
        any(f["function"] == "cuModuleLoadData" for f in s["frames"]) and any(f["function"] == "load_module" for f in s["frames"])
        for s in mods), f"modules (eager): {loaded / MiB:.1f} MiB of kind module, at least 64 MiB, through cuModuleLoadData and load_module")
    p = listed.get(pid)
    check(p is not None and p.get("module_bytes") == loaded, f"modules (eager): module_bytes {p and p.get('module_bytes')} = its module rows' {loaded}")
check(abs(gpu["used_bytes"] - used_mib * MiB) <= MiB, f"GPU 0: gpu-mem's used {gpu['used_bytes']} B = nvidia-smi's memory.used {used_mib} MiB within 1 MiB")
on_gpu = sum(s["live_bytes"] for s in r["stacks"] if s["kind"] != "tensor" and s["gpu"] == "0")
check(abs(on_gpu + gpu["not_of_processes_bytes"] - used_mib * MiB) <= MiB * max(1, len(gpu["processes"])),
      f"GPU 0: gpu-mem's rows {on_gpu} B + of no process {gpu['not_of_processes_bytes']} B = memory.used")
print("lazy against eager: modules, driver-internal (kernel images and driver internals) "
      + ", ".join(f"{n} {listed[pids[n]]['module_bytes'] / MiB:.1f} MiB, {listed[pids[n]]['driver_internal_bytes'] / MiB:.1f} MiB"
                  for n in ("model (lazy)", "model (eager)", "modules (lazy)", "modules (eager)") if n in pids and pids[n] in listed))
sys.exit(1 if failed else 0)
