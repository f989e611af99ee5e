"""Checks gpu-mem's JSON reports of tests/gpu/run_components.sh's scenarios
against what each workload says it holds ("expect" and "stats" lines of its
stdout), and prints what each report shows.

Usage:
  check_components.py jax JSON STDOUT NAME [--exact]
                                                   jax_sites.py: live bytes per function
  check_components.py arena JSON STDOUT NAME       jax_sites.py, default preallocation: who holds the arena
  check_components.py compare LIB_JSON DISC_JSON STDOUT DISC_STDERR NAME
                                                   what discovery missed against --library
  check_components.py modes JSON STDOUT            torch_modes.py: one PyTorch allocator mode
  check_components.py nccl JSON STDOUT             torch_nccl.py: driver bytes by owning library
  check_components.py ranks JSON STDOUT            torch_nccl_ranks.py: each rank's bytes on its GPU
  check_components.py graphs JSON STDOUT           torch_graphs.py: the graph's private pool
Each prints a last line "RESULT NAME: ok|MISMATCH|seen ..." and exits 1 on
a mismatch where an exact answer is expected.
"""
import json
import os
import sys
from collections import defaultdict

DRIVER_KINDS = ("device", "vmm")
GRANULE = 2 << 20  # cuMemCreate's allocation granularity on the H200


def load(path):
    with open(path) as f:
        return json.load(f)


def workload(path):
    """The expect, stats and t lines of a workload's stdout."""
    out = {"expect": {}, "stats": {}, "t": [], "arrays": {}}
    with open(path) as f:
        for line in f:
            if line.startswith("expect "):
                out["expect"] = {k: int(v) for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
            elif line.startswith("stats "):
                out["stats"] = json.loads(line[6:])
            elif line.startswith("arrays "):
                out["arrays"] = {k: [int(n) for n in v.split(",")] for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
            elif line.startswith("t "):
                _, phase, when, mapped = line.split()
                out["t"].append((phase, float(when), mapped))
    return out


def base(path):
    return os.path.basename(path or "")


def is_python(frame):
    return bool(frame.get("file"))


def innermost(stack, script):
    """The innermost frame of the stack in the script, or None."""
    for f in stack["frames"]:
        if f.get("file", "").endswith(script):
            return f["function"]
    return None


def innermost_py(stack):
    for f in stack["frames"]:
        if is_python(f):
            return f"{f['function']} ({base(f['file'])}:{f.get('line', 0)})"
    return "-"


def unnamed(frame):
    return not is_python(frame) and "+0x" in frame["function"]


def owner(stack):
    """The library that asked the driver: the first native frame past the
    driver and the CUDA runtime."""
    for f in stack["frames"][1:]:
        if is_python(f):
            return "python"
        m = base(f.get("module")) or f["function"].split("+0x")[0]
        if m.startswith(("libcuda.so", "libcudart")) or f["function"].startswith("cuda"):
            continue
        return m
    return "-"


def native_key(stack):
    """The driver function and the native frames up to the interpreter:
    the same in two recorders whether or not Python frames were read."""
    names = []
    for f in stack["frames"]:
        if is_python(f):
            break
        m = base(f.get("module"))
        if m.startswith(("python", "libpython")) or "_PyEval" in f["function"]:
            break
        names.append(f["function"])
    return (stack["kind"],) + tuple(names[:12])


def compact(stack, n=10):
    return " <- ".join(f["function"] for f in stack["frames"][:n])


def summary(report, title=""):
    """What a report holds: per process and kind, per driver function, the
    top stacks, unnamed frames, Python and losses."""
    print(f"--- {title}")
    per = defaultdict(lambda: defaultdict(int))
    ops = defaultdict(lambda: [0, 0, 0, 0])
    for s in report["stacks"]:
        key = (s["pid"], s["comm"], s["kind"], s["gpu"])
        for field in ("live_bytes", "allocated_bytes", "allocations", "frees", "freed_bytes"):
            per[key][field] += s[field]
        op = ops[(s["kind"], s["frames"][0]["function"] if s["frames"] else "?")]
        op[0] += s["allocations"]
        op[1] += s["allocated_bytes"]
        op[2] += s["freed_bytes"]
        op[3] += s["live_bytes"]
    print(f"{'pid':>7} {'comm':15} {'kind':12} {'gpu':8} {'live':>14} {'allocated':>14} {'allocs':>7} {'frees':>7}")
    for (pid, comm, kind, gpu), c in sorted(per.items()):
        print(f"{pid:>7} {comm:15} {kind:12} {gpu:8} {c['live_bytes']:>14} {c['allocated_bytes']:>14} {c['allocations']:>7} {c['frees']:>7}")
    print("by function called:")
    for (kind, op), (n, a, fr, live) in sorted(ops.items()):
        print(f"  {kind:12} {op:30} {n:>6} calls {a:>14} allocated {fr:>14} freed {live:>14} live")
    tops = sorted(report["stacks"], key=lambda s: (s["live_bytes"], s["allocated_bytes"]), reverse=True)[:8]
    print("top stacks by live bytes:")
    for s in tops:
        print(f"  {s['live_bytes']:>12} live {s['allocated_bytes']:>12} alloc {s['allocations']:>4}x {s['kind']:11} gpu={s['gpu']:7} "
              f"owner={owner(s)} py={innermost_py(s)}")
        print(f"      {compact(s, 12)}")
    stacks_unnamed = [s for s in report["stacks"] if any(unnamed(f) for f in s["frames"])]
    mods = defaultdict(int)
    for s in stacks_unnamed:
        for f in s["frames"]:
            if unnamed(f):
                mods[f["function"].split("+0x")[0]] += 1
    print(f"stacks with unnamed native frames: {len(stacks_unnamed)} of {len(report['stacks'])}; by module: {dict(mods)}")
    print("python:", json.dumps(report.get("python")), "losses:", json.dumps(report.get("losses")))
    print("ledger:", json.dumps(report.get("ledger")), "events:", report.get("events"), "libraries:", report.get("libraries"))
    if report.get("failures"):
        print("failures:", [(f["function"], f["result"], f["requested_bytes"], f["count"]) for f in report["failures"]])


def per_function(report, script, kinds, field="live_bytes"):
    out = defaultdict(int)
    for s in report["stacks"]:
        if s["kind"] in kinds:
            out[innermost(s, script) or "(no frame in " + script + ")"] += s[field]
    return out


def gpus(report, kinds=DRIVER_KINDS + ("tensor",)):
    out = defaultdict(int)
    for s in report["stacks"]:
        if s["kind"] in kinds:
            out[f"{s['kind']}:gpu={s['gpu']}"] += s["allocated_bytes"]
    return dict(out)


def table(rows, expect):
    ok = True
    for name in list(expect) + sorted(set(rows) - set(expect)):
        got, want = rows.get(name, 0), expect.get(name)
        if want is None:
            print(f"  {name:32} {got:>14}  (not expected)")
            continue
        ok = ok and got == want
        print(f"  {name:32} {got:>14} want {want:>14}  {'ok' if got == want else 'MISMATCH'}")
    return ok


def cmd_jax(args):
    """XLA's platform allocator makes each buffer one cuMemCreate (vmm), its
    size rounded up to the allocation granularity (2 MiB on the H200); the
    libraries XLA calls (cuBLAS, cuDNN) make their own cuMemAlloc (device)."""
    report, w = load(args[0]), workload(args[1])
    exact = "--exact" in args
    summary(report, "jax_sites.py")
    print("stats:", json.dumps(w["stats"]))
    want = {k: sum(-(-n // GRANULE) * GRANULE for n in v) for k, v in w["arrays"].items()}
    print(f"live vmm bytes per innermost function in jax_sites.py, against its arrays' nbytes rounded up to {GRANULE}:")
    rows = per_function(report, "jax_sites.py", ("vmm",))
    ok = table(rows, want)
    print("live bytes of the other driver allocations (cuMemAlloc, cuMemHostAlloc) per innermost function, by owner:")
    for s in report["stacks"]:
        if s["kind"] in ("device", "host-pinned") and s["live_bytes"]:
            print(f"  {innermost(s, 'jax_sites.py') or '-':24} {s['kind']:12} {s['live_bytes']:>12} in {s['live_allocations']} "
                  f"owner={owner(s)} via {' <- '.join(f['function'] for f in s['frames'] if 'Create' in f['function'])[:80]}")
    print("allocated bytes per gpu label:", gpus(report))
    unknown = sum(v for k, v in gpus(report).items() if k.endswith("unknown"))
    mine = sum(rows.get(k, 0) for k in want)
    print(f"RESULT {args[2]}: {'ok' if ok else 'MISMATCH'}: vmm {mine} bytes under the right functions, want {sum(want.values())} "
          f"(arrays' nbytes {w['stats'].get('held_bytes')}, rounded to 2 MiB); other live: "
          f"{ {k: v for k, v in per_function(report, 'jax_sites.py', ('device',)).items() if v} } device; gpu unknown for {unknown} bytes")
    return 0 if ok or not exact else 1


def cmd_arena(args):
    report, w = load(args[0]), workload(args[1])
    summary(report, "jax_sites.py, default preallocation")
    print("stats:", json.dumps(w["stats"]))
    dev = [s for s in report["stacks"] if s["kind"] in DRIVER_KINDS]
    if not dev:
        print(f"RESULT {args[2]}: no device allocation seen")
        return 1
    big = max(dev, key=lambda s: s["live_bytes"])
    print(f"largest live stack: {big['live_bytes']} bytes in {big['live_allocations']} allocation(s), gpu={big['gpu']}")
    for f in big["frames"]:
        print(f"    {f['function']}  {base(f.get('module')) or (base(f.get('file')) + ':' + str(f.get('line', 0)))}")
    limit = (w["stats"].get("memory_stats") or {}).get("bytes_limit")
    print("RESULT %s: seen: %d bytes (XLA bytes_limit %s) charged to %s, gpu=%s" %
          (args[2], big["live_bytes"], limit, innermost(big, "jax_sites.py") or innermost_py(big), big["gpu"]))
    return 0


def cmd_compare(args):
    lib, disc, w = load(args[0]), load(args[1]), workload(args[2])
    groups = defaultdict(lambda: {"lib": [0, 0], "disc": [0, 0], "py": set()})
    for name, rep in (("lib", lib), ("disc", disc)):
        for s in rep["stacks"]:
            g = groups[native_key(s)]
            g[name][0] += s["allocations"]
            g[name][1] += s["allocated_bytes"]
            if name == "lib":
                g["py"].add(innermost_py(s))
    for name, rep in (("--library", lib), ("discovery", disc)):
        tot = defaultdict(lambda: [0, 0])
        for s in rep["stacks"]:
            tot[s["kind"]][0] += s["allocations"]
            tot[s["kind"]][1] += s["allocated_bytes"]
        print(f"{name:10} allocations by kind: {dict(tot)}; by gpu: {gpus(rep)}; python: {json.dumps(rep['python'])}; "
              f"unknown frees: {rep['ledger'].get('unknown_frees', rep['ledger'])}")
    missed_n = missed_b = 0
    print("stacks with allocations discovery missed (native key; Python frames as --library saw them):")
    for key, g in sorted(groups.items(), key=lambda kv: -kv[1]["lib"][1]):
        dn, db = g["lib"][0] - g["disc"][0], g["lib"][1] - g["disc"][1]
        if dn > 0 or db > 0:
            missed_n, missed_b = missed_n + dn, missed_b + db
            print(f"  missed {dn} of {g['lib'][0]} ({db} bytes) {key[0]}: {' <- '.join(key[1:6])}  py={sorted(g['py'])}")
        elif dn < 0:
            print(f"  discovery saw {-dn} more: {key[0]}: {' <- '.join(key[1:6])}")
    with open(args[3]) as f:
        attached = [line.split()[0] for line in f if "attached to" in line and "driver functions" in line]
    print("workload phases (epoch, libcuda mapped):", w["t"])
    print("discovery attached to the driver at:", attached)
    mapped = [t for phase, t, m in w["t"] if m == "libcuda=1"]
    when = ""
    if attached and w["t"]:
        a = float(attached[0])
        rel = {phase: round(a - t, 3) for phase, t, _ in w["t"]}
        when = f"; attached {rel} s after each phase"
    lib_all = sum(g["lib"][0] for g in groups.values())
    print(f"RESULT {args[4]}: missed {missed_n} of {lib_all} allocations ({missed_b} bytes); "
          f"gpu labels {gpus(disc)} vs --library {gpus(lib)}{when}; first phase with libcuda mapped at "
          f"{mapped[0] if mapped else '?'}")
    return 0


def cmd_modes(args):
    report, w = load(args[0]), workload(args[1])
    stats, expect = w["stats"], w["expect"]
    mode = stats.get("mode", "?")
    summary(report, f"torch_modes.py, {mode}")
    print("stats:", json.dumps(stats))
    pid_rows = report["stacks"]  # the workload is the only process using the GPU
    driver_live = sum(s["live_bytes"] for s in pid_rows if s["kind"] in DRIVER_KINDS)
    tensor_live = sum(s["live_bytes"] for s in pid_rows if s["kind"] == "tensor")
    fns = sorted(set(expect) | {"scratch", "release_cache"})
    print(f"  {'function':16} {'tensor live':>12} {'want':>12} {'driver live':>12} {'driver alloc':>13} {'driver freed':>13} {'calls':>6}")
    views = {k: per_function(report, "torch_modes.py", kinds, field) for k, kinds, field in (
        ("tl", ("tensor",), "live_bytes"), ("dl", DRIVER_KINDS, "live_bytes"), ("da", DRIVER_KINDS, "allocated_bytes"),
        ("df", DRIVER_KINDS, "freed_bytes"), ("dn", DRIVER_KINDS, "allocations"))}
    for fn in fns + ["(no frame in torch_modes.py)"]:
        print(f"  {fn:16} {views['tl'].get(fn, 0):>12} {expect.get(fn, 0):>12} {views['dl'].get(fn, 0):>12} "
              f"{views['da'].get(fn, 0):>13} {views['df'].get(fn, 0):>13} {views['dn'].get(fn, 0):>6}")
    reserved, allocated = stats.get("memory_reserved"), stats.get("memory_allocated")
    calls = sum(s["allocations"] for s in pid_rows if s["kind"] in DRIVER_KINDS)
    frees = sum(s["frees"] for s in pid_rows if s["kind"] in DRIVER_KINDS)
    ms = stats.get("memory_stats") if isinstance(stats.get("memory_stats"), dict) else {}
    print(f"driver calls seen: {calls} allocations, {frees} frees; PyTorch's num_device_alloc {ms.get('num_device_alloc')}, "
          f"num_device_free {ms.get('num_device_free')}; failures: {[(f['function'], f['result'], f['requested_bytes']) for f in report['failures']]}")
    print(f"process: driver live {driver_live} vs memory_reserved {reserved} (diff {driver_live - reserved if isinstance(reserved, int) else '?'}); "
          f"tensor live {tensor_live} vs memory_allocated {allocated} and held {stats.get('held_bytes')}")
    tensors_ok = all(views["tl"].get(k, 0) == v for k, v in expect.items())
    driver_ok = all(views["dl"].get(k, 0) == v for k, v in expect.items())
    # What each mode should show: the caching allocator's segments are what
    # PyTorch reserved, its tensors come from its probes; cudaMallocAsync and
    # caching off ask the driver for each tensor (no probes under the former).
    if mode == "backend:cudaMallocAsync":
        checks = {"driver bytes per function exact": driver_ok, "driver bytes == memory_allocated": driver_live == allocated}
    elif mode == "no-caching":
        checks = {"driver bytes per function exact": driver_ok, "tensor view per function exact": tensors_ok}
    else:
        checks = {"tensor view per function exact": tensors_ok, "driver bytes == memory_reserved": driver_live == reserved}
    ok = all(checks.values())
    print("checks:", checks)
    print(f"RESULT {mode}: {'ok' if ok else 'MISMATCH'}: driver live {driver_live} / reserved {reserved}; tensor live {tensor_live} / "
          f"allocated {allocated} / held {stats.get('held_bytes')}; {', '.join(k for k, v in checks.items() if v) or '-'}")
    return 0 if ok else 1


def cmd_nccl(args):
    report, w = load(args[0]), workload(args[1])
    stats = w["stats"]
    summary(report, "torch_nccl.py")
    print("stats:", json.dumps(stats))
    by_owner = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for s in report["stacks"]:
        if s["kind"] == "tensor":
            continue
        names = " ".join(base(f.get("module")) for f in s["frames"])
        tag = owner(s)
        if "libnccl" in names and "libnccl" not in tag:
            tag += " (via libnccl)"
        if "libcublas" in names and "libcublas" not in tag:
            tag += " (via libcublas)"
        o = by_owner[s["kind"]][tag]
        o[0] += s["live_bytes"]
        o[1] += s["allocated_bytes"]
        o[2] += s["allocations"]
    print("driver memory by owning library (first native frame past libcuda/libcudart):")
    for kind, owners in by_owner.items():
        for tag, (live, alloc, n) in sorted(owners.items(), key=lambda kv: -kv[1][1]):
            print(f"  {kind:12} {tag:40} {live:>12} live {alloc:>12} allocated {n:>5} calls")
    print("stacks outside PyTorch's allocator:")
    for s in sorted(report["stacks"], key=lambda s: -s["allocated_bytes"]):
        if s["kind"] == "tensor" or owner(s).startswith("libc10_cuda"):
            continue
        print(f"  {s['live_bytes']:>12} live {s['allocated_bytes']:>12} alloc {s['allocations']:>3}x {s['kind']:11} gpu={s['gpu']} py={innermost_py(s)}")
        print(f"      {compact(s, 14)}")
    driver_live = sum(s["live_bytes"] for s in report["stacks"] if s["kind"] in DRIVER_KINDS)
    torch_live = sum(s["live_bytes"] for s in report["stacks"] if s["kind"] in DRIVER_KINDS and owner(s).startswith("libc10_cuda"))
    reserved = stats.get("memory_reserved", 0)
    other = {f"{k}:{t}": v[0] for k, owners in by_owner.items() for t, v in owners.items() if not t.startswith("libc10_cuda") and v[0]}
    print("live bytes per innermost torch_nccl.py function (driver):", dict(per_function(report, "torch_nccl.py", DRIVER_KINDS)))
    print("live bytes per innermost torch_nccl.py function (tensor):", dict(per_function(report, "torch_nccl.py", ("tensor",))))
    print(f"RESULT nccl: driver live {driver_live} - memory_reserved {reserved} = {driver_live - reserved}; "
          f"PyTorch allocator's segments {torch_live}; others live {other}")
    return 0


def cmd_ranks(args):
    """Each rank's driver bytes: all on its own GPU, PyTorch's segments equal
    to its memory_reserved(), the rest named by NCCL's and cuBLAS's stacks."""
    report, w = load(args[0]), workload(args[1])
    summary(report, "torch_nccl_ranks.py")
    ok = True
    for r in w["stats"]["ranks"]:
        stacks = [s for s in report["stacks"] if s["pid"] == r["pid"] and s["kind"] in DRIVER_KINDS]
        by_gpu, by_owner = defaultdict(int), defaultdict(int)
        for s in stacks:
            by_gpu[s["gpu"]] += s["live_bytes"]
            names = " ".join(base(f.get("module")) for f in s["frames"])
            tag = "libnccl" if "libnccl" in names else "libcublas" if "libcublas" in names else owner(s)
            by_owner[tag] += s["live_bytes"]
        torch_live = sum(v for k, v in by_owner.items() if k.startswith("libc10_cuda"))
        others = {k: v for k, v in by_owner.items() if not k.startswith("libc10_cuda") and v}
        device = {g: v for g, v in by_gpu.items() if g != "host"}
        own = list(device) == [str(r["gpu"])]
        exact = torch_live == r["memory_reserved"]
        ok = ok and own and exact and others.get("libnccl", 0) > 0
        print(f"rank {r['rank']} pid {r['pid']}: live by gpu {dict(by_gpu)}; PyTorch segments {torch_live} "
              f"= memory_reserved {r['memory_reserved']}: {exact}; others {others}; device_used {r['device_used']}")
    print(f"RESULT ranks: {'ok' if ok else 'MISMATCH'} ({len(w['stats']['ranks'])} ranks, NCCL {w['stats'].get('nccl')})")
    return 0 if ok else 1


def cmd_graphs(args):
    report, w = load(args[0]), workload(args[1])
    stats, expect = w["stats"], w["expect"]
    summary(report, "torch_graphs.py")
    print("stats:", json.dumps(stats))
    dev = per_function(report, "torch_graphs.py", DRIVER_KINDS)
    ten = per_function(report, "torch_graphs.py", ("tensor",))
    print("live bytes per innermost torch_graphs.py function: driver", dict(dev), "tensor", dict(ten))
    want_seg = expect.get("pool_segments", 0) + expect.get("default_segments", 0)
    want_ten = expect.get("pool_requested", 0) + expect.get("default_requested", 0)
    seg_ok = dev.get("capture_step", 0) == want_seg
    ten_ok = ten.get("capture_step", 0) == want_ten
    print(f"RESULT graphs: {'ok' if seg_ok and ten_ok else 'MISMATCH'}: capture_step's segments {dev.get('capture_step', 0)}, "
          f"want {want_seg} (private pool {expect.get('pool_segments')} + default pool {expect.get('default_segments')}); "
          f"tensors {ten.get('capture_step', 0)}, want {want_ten} (private pool {expect.get('pool_requested')} + default pool "
          f"{expect.get('default_requested')})")
    return 0 if seg_ok and ten_ok else 1


COMMANDS = {"jax": cmd_jax, "arena": cmd_arena, "compare": cmd_compare, "modes": cmd_modes, "nccl": cmd_nccl,
            "ranks": cmd_ranks, "graphs": cmd_graphs}

if __name__ == "__main__":
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
