"""Checks gpu-mem's peaks (issue 19) against the framework's own account, for
run_peaks.sh. Prints PASS, FAIL or SKIP per check; exits 1 if any failed.

  check_peaks.py torch GPUMEM_JSON WORKLOAD_STDOUT [AGENT_PEAKS_JSON]
      torch_peaks.py, recorded by gpumem record --format json:
      - the tensor view's peak of the process on its GPU = max_memory_allocated(),
        and = memory_stats()'s requested_bytes.all.peak (what the probes report);
      - the allocator's segments (driver rows through c10::cuda::CUDACachingAllocator,
        as the HTML report's "allocator segments") at the driver view's peak
        = max_memory_reserved();
      - activation_spike holds the most at each view's peak (the top of the peak
        flame graph, by the workload's own functions), and no tensor at the
        end (absent from the live flame graph of the tensor view);
      - with the agent's peaks (check_peaks.py scrape): its highest interval
        peak of tensors = max_memory_allocated(), its highest driver view peak
        = record's.
  check_peaks.py jax GPUMEM_JSON WORKLOAD_STDOUT [AGENT_PEAKS_JSON]
      jax_peaks.py (XLA's platform allocator: a cuMemCreate per buffer, kind vmm):
      - the vmm bytes at the driver view's peak = memory_stats()["peak_bytes_in_use"]
        (SKIP where the backend keeps no such stat), and = the arrays alive then;
      - activation_spike on top of the peak, holding nothing at the end;
      - the agent's highest driver view peak = record's.
  check_peaks.py scrape URL OUT
      Scrapes the agent's /metrics every 0.1 s until SIGTERM or SIGINT and keeps,
      in OUT (JSON), the highest value seen of gpumem_peak_bytes and
      gpumem_tensor_peak_bytes per pid and gpu: each is an interval's peak, shown
      for one interval.
"""
import json
import os
import re
import signal
import sys
import time
import urllib.request

ALLOCATOR = "CUDACachingAllocator::"  # report/views.go's AllocatorSegment
MiB = 1 << 20
failed = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failed.append(name)


def skip(name, why):
    print(f"SKIP {name}: {why}")


def load(report_path, stdout_path):
    report = json.load(open(report_path))
    expect = {}
    for line in open(stdout_path):
        if line.startswith("expect "):
            expect = {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    if not expect:
        sys.exit("no expect line in " + stdout_path)
    return report, expect


def owner(frames, owners):
    """The workload's function a stack is under: its innermost frame among
    owners, else whether it has Python frames at all (autograd's device
    thread and XLA's threads have none)."""
    for f in frames:
        if f["function"].split(".<locals>.")[0] in owners:
            return f["function"]
    return "(elsewhere)" if any(f.get("file") for f in frames) else "(no Python frame)"


def by_owner(stacks, owners, field):
    out = {}
    for s in stacks:
        name = owner(s["frames"], owners)
        out[name] = out.get(name, 0) + s[field]
    return out


def table(title, rows):
    print(title)
    for name, n in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"  {name:28} {n:>14} ({n / MiB:.1f} MiB)")


def peak_of(report, pid, view, gpu=None):
    """The process's peak in view on gpu (default: its highest in the view)."""
    peaks = [p for p in report.get("peaks", []) if p["pid"] == pid and p["view"] == view and (gpu is None or p["gpu"] == gpu)]
    return max(peaks, key=lambda p: p["bytes"]) if peaks else None


def describe(p):
    return f"{p['bytes']} bytes ({p['bytes'] / MiB:.1f} MiB) in {p['allocations']} allocations on gpu {p['gpu']} at {p['time']}"


def on_top(name, peak, owners, spike):
    rows = by_owner(peak["stacks"], owners, "bytes")
    table(f"{name}: {describe(peak)}, by function:", rows)
    top = max(rows, key=rows.get)
    check(f"{spike} on top of the {name}", top == spike, f"{top} holds the most, {rows[top]} bytes; {spike} {rows.get(spike, 0)}")
    return rows


def agent(path, pid, gpu, metric):
    """The highest interval peak the agent's gauge showed, or None."""
    if not path or not os.path.exists(path):
        return None
    return json.load(open(path)).get(metric, {}).get(f"{pid}/{gpu}")


def check_agent(path, pid, gpu, metric, want, what):
    got = agent(path, pid, gpu, metric)
    if not path:
        return
    if got is None:
        check(f"agent: {metric}", False, f"no gauge of pid {pid} gpu {gpu} scraped ({path})")
        return
    check(f"agent: highest {metric} = {what}", got == want, f"{got} against {want}")


TORCH_OWNERS = ("build_model", "warm_up", "load_batch", "activation_spike", "backward_pass", "optimizer_step")


def cmd_torch(args):
    report, expect = load(args[0], args[1])
    agent_path = args[2] if len(args) > 2 else None
    pid = expect["pid"]
    tensor = peak_of(report, pid, "tensor")
    if tensor is None:
        check("a tensor view peak", False, f"none for pid {pid}: {[(p['pid'], p['view'], p['gpu']) for p in report.get('peaks', [])]}")
        return
    gpu = tensor["gpu"]
    driver = peak_of(report, pid, "driver", gpu)
    print(f"pid {pid} gpu {gpu}: PyTorch says max_memory_allocated {expect['max_allocated']}, requested_bytes.all.peak "
          f"{expect['max_requested']}, max_memory_reserved {expect['max_reserved']}; now allocated {expect['allocated']}, "
          f"reserved {expect['reserved']}; activation_spike made {expect['spike']} bytes of activations")
    check("tensor view peak = torch.cuda.max_memory_allocated()", tensor["bytes"] == expect["max_allocated"],
          f"{tensor['bytes']} against {expect['max_allocated']}")
    check("tensor view peak = requested_bytes.all.peak", tensor["bytes"] == expect["max_requested"],
          f"{tensor['bytes']} against {expect['max_requested']} (the probes report requested bytes; equal to the blocks' "
          "when every size is a multiple of 512 and no large block is left unsplit)")
    tensors = on_top("tensor view's peak", tensor, TORCH_OWNERS, "activation_spike")
    if driver is None:
        check("a driver view peak", False, f"none for pid {pid} on gpu {gpu}")
        return
    segments = sum(s["bytes"] for s in driver["stacks"] if any(ALLOCATOR in f["function"] for f in s["frames"]))
    check("allocator segments at the driver view's peak = torch.cuda.max_memory_reserved()", segments == expect["max_reserved"],
          f"{segments} against {expect['max_reserved']}; the driver view's peak {driver['bytes']}, "
          f"{driver['bytes'] - segments} of it outside the allocator (cuBLAS's handles, ...)")
    on_top("driver view's peak", driver, TORCH_OWNERS, "activation_spike")
    mine = [s for s in report["stacks"] if s["pid"] == pid and s["gpu"] == gpu]
    live = by_owner([s for s in mine if s["kind"] == "tensor"], TORCH_OWNERS, "live_bytes")
    table("tensor view at the end (live), by function:", live)
    check("activation_spike absent from the tensor view at the end", live.get("activation_spike", 0) == 0 and tensors.get("activation_spike", 0) > 0,
          f"{live.get('activation_spike', 0)} bytes live, {tensors.get('activation_spike', 0)} at the peak")
    cached = by_owner([s for s in mine if s["kind"] != "tensor"], TORCH_OWNERS, "live_bytes").get("activation_spike", 0)
    print(f"driver view at the end: activation_spike's segments still hold {cached} bytes (the allocator's cache)")
    check_agent(agent_path, pid, gpu, "gpumem_tensor_peak_bytes", expect["max_allocated"], "max_memory_allocated()")
    check_agent(agent_path, pid, gpu, "gpumem_peak_bytes", driver["bytes"], "record's driver view peak")


JAX_OWNERS = ("init_backend", "load_params", "activation_spike")


def cmd_jax(args):
    report, expect = load(args[0], args[1])
    agent_path = args[2] if len(args) > 2 else None
    pid = expect["pid"]
    vmm_gpus = {s["gpu"] for s in report["stacks"] if s["pid"] == pid and s["kind"] == "vmm"}
    if not vmm_gpus:
        check("XLA's buffers seen (kind vmm)", False, f"no vmm stack of pid {pid}: is XLA_PYTHON_CLIENT_ALLOCATOR=platform set?")
        return
    gpu = sorted(vmm_gpus)[0]
    peak = peak_of(report, pid, "driver", gpu)
    if peak is None:
        check("a driver view peak", False, f"none for pid {pid} on gpu {gpu}")
        return
    vmm = sum(s["bytes"] for s in peak["stacks"] if s["kind"] == "vmm")
    print(f"pid {pid} gpu {gpu}: the driver view's peak {describe(peak)}, {vmm} of it XLA's buffers (vmm), "
          f"{peak['bytes'] - vmm} other driver memory (cuDNN's, cuBLAS's handles)")
    if expect["peak_bytes_in_use"] < 0:
        skip("vmm at the driver view's peak = memory_stats()['peak_bytes_in_use']", "the backend's memory_stats() has no peak_bytes_in_use")
    else:
        check("vmm at the driver view's peak = memory_stats()['peak_bytes_in_use']", vmm == expect["peak_bytes_in_use"],
              f"{vmm} against {expect['peak_bytes_in_use']}")
    check("vmm at the driver view's peak = the arrays alive at the spike", vmm == expect["arrays_at_peak"],
          f"{vmm} against {expect['arrays_at_peak']} (every size a multiple of the 2 MiB granule)")
    vmm_peak = dict(peak, stacks=[s for s in peak["stacks"] if s["kind"] == "vmm"])
    at_peak = on_top("driver view's peak (vmm)", vmm_peak, JAX_OWNERS, "activation_spike")
    live = by_owner([s for s in report["stacks"] if s["pid"] == pid and s["kind"] == "vmm"], JAX_OWNERS, "live_bytes")
    table("vmm at the end (live), by function:", live)
    check("activation_spike absent from the driver view at the end", live.get("activation_spike", 0) == 0 and at_peak.get("activation_spike", 0) > 0,
          f"{live.get('activation_spike', 0)} bytes live, {at_peak.get('activation_spike', 0)} at the peak")
    check_agent(agent_path, pid, gpu, "gpumem_peak_bytes", peak["bytes"], "record's driver view peak")


SAMPLE = re.compile(r'^(gpumem_(?:tensor_)?peak_bytes)\{([^}]*)\} (\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def cmd_scrape(args):
    url, out = args
    highest = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    while not stop:
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            time.sleep(0.1)
            continue
        changed = False
        for line in text.splitlines():
            m = SAMPLE.match(line)
            if not m:
                continue
            labels = dict(LABEL.findall(m.group(2)))
            key, value = f"{labels.get('pid')}/{labels.get('gpu')}", int(float(m.group(3)))
            metric = highest.setdefault(m.group(1), {})
            if value > metric.get(key, -1):
                metric[key] = value
                changed = True
        if changed:
            with open(out + ".tmp", "w") as f:
                json.dump(highest, f, indent=1, sort_keys=True)
            os.replace(out + ".tmp", out)
        time.sleep(0.1)
    return 0


COMMANDS = {"torch": cmd_torch, "jax": cmd_jax, "scrape": cmd_scrape}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](sys.argv[2:])
    sys.exit(1 if failed else 0)
