"""Writes MODEL.md, the real model's sections of BENCHMARKS.md, from the
lines bench/gpu/model.sh printed (kept in bench/gpu/h100/ or h200/).

Usage: model_report.py [--jax JAX_TXT] NOCACHE_TXT MODEL_MD MODEL_TXT
   or: model_report.py --table MODEL_TXT  (one run's table alone, to stdout)
MODEL_TXT is one run (one process): each figure is the median of its
rounds, with the spread (lowest-highest); ratios are against no agent in
the same process. The tensor micro-benchmark (torch.empty + del at Python
depth 5 and 40) is reported as the cost added over no agent, against the
floor's (empty programs on the same USDT sites). NOCACHE_TXT is a run with
PYTORCH_NO_CUDA_MEMORY_CACHING=1, JAX_TXT one of jax_cost.py. Each section
names the machine from its file's "# machine: " line (model.sh writes it).
"""
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = {
    "none": "no agent",
    "default": "**the default** (`gpumem agent`: the driver view; the tensor view on demand, no process switched on)",
    "driver": "`--tensors=off` (the driver view only)",
    "tensors": "the tensor view switched on for this process (`--tensor-pid`)",
    "native": "the same with `--tensor-native-stacks`",
    "all": "`--tensors=all` (every process's tensor view)",
    "base": "another build, side by side (`BASE_GPUMEM`)",
    "state": "the default keeping its state for the next agent (`--state-dir`, `--pin-path`)",
    "floor": "floor: empty programs on the tensor USDT sites (the traps alone)",
}


def read(path):
    rows = {}
    for line in open(path):
        if " result " not in line:
            continue
        kv = dict(x.split("=", 1) for x in line.split() if "=" in x)
        rows.setdefault(kv["mode"], []).append({k: float(v) for k, v in kv.items() if k not in ("mode", "round")})
    return rows


def measured(path, rows, env=""):
    """Where a run was measured, its raw lines and the command that makes them again (env: what the
    run's environment adds to MODES and ROUNDS)."""
    machine = next((line[len("# machine: "):].strip() for line in open(path) if line.startswith("# machine: ")),
                   "a machine not recorded")
    modes = " ".join(rows)  # in the order of the first round, as MODES gave them
    env += f'MODES="{modes}" ROUNDS={len(rows["none"])}'
    return (f"Measured on {machine}, by `{env} bench/gpu/model.sh GPUMEM USDTFLOOR OUT` on the GPU machine "
            f"(raw lines: `{os.path.relpath(os.path.abspath(path), ROOT)}`).\n\n")


def med(xs, key):
    values = [x[key] for x in xs]
    return statistics.median(values), min(values), max(values)


def main():
    args = sys.argv[1:]
    if args[0] == "--table":  # one run's table alone: model_report.py --table RAW
        rows = read(args[1])
        sys.stdout.write(measured(args[1], rows))
        table(sys.stdout, rows)
        return
    jax_path = None
    if args[0] == "--jax":
        jax_path, args = args[1], args[2:]
    nocache_path, out, path = args
    rows = read(path)
    f = open(out, "w")
    first = rows["none"][0]
    f.write("\n## What does the agent cost a real model?\n\n")
    f.write("A transformers Llama (8 layers, hidden 2048, 16 heads, bf16) built from a config: a training step "
            f"(batch 4 x 512, AdamW; {int(first['allocs_step'])} tensor allocations) and greedy decoding (batch 1; "
            f"{first['allocs_token']:.0f} tensor allocations a token). Every mode runs in ONE Python process, the "
            "agent started before each window and stopped after it, the modes rotated from round to round, the "
            f"model's main thread on a CPU of its own; medians of {len(rows['none'])} rounds, spread in brackets, "
            "ratios against no agent in the same process.\n\n")
    f.write(measured(path, rows))
    t5, t40 = run(f, rows)
    f.write(f"\nTargets: the default within 1% of no agent (met, by the bound above; the timings cannot resolve 1%); "
            f"the tensor view at most 1.2x the floor at depth 5 ({'met' if t5 <= 1.2 else 'missed'}: {t5:.2f}x) "
            f"and 1.5x at depth 40 ({'met' if t40 <= 1.5 else 'missed'}: {t40:.2f}x).\n")
    write_nocache(f, nocache_path)
    write_jax(f, jax_path)
    f.close()


def table(f, rows):
    """Writes each mode's training step and decoding against no agent's; returns no agent's medians."""
    base = rows["none"]
    step0, tok0 = med(base, "step_ms")[0], med(base, "tok_s")[0]
    f.write("| agent | training step, ms | vs none | decode, tokens/s | vs none | BPF run time per program run |\n")
    f.write("| --- | ---: | ---: | ---: | ---: | ---: |\n")
    for mode in ("none", "default", "state", "driver", "tensors", "native", "all", "base", "floor"):
        if mode not in rows:
            continue
        r = rows[mode]
        s, slo, shi = med(r, "step_ms")
        t, tlo, thi = med(r, "tok_s")
        runs, ns = sum(x["bpf_runs"] for x in r), sum(x["bpf_ns"] for x in r)
        per = f"{ns / runs:.0f} ns ({runs / len(r):.0f} runs a window)" if runs else "-"
        f.write(f"| {NAMES[mode]} | {s:.2f} [{slo:.1f}-{shi:.1f}] | {s / step0:.3f}x | {t:.1f} [{tlo:.0f}-{thi:.0f}] | "
                f"{t / tok0:.3f}x | {per} |\n")
    return step0, tok0


def run(f, rows):
    """Writes the run's tables; returns the tensor view's ratios to the floor at depth 5 and 40."""
    base = rows["none"]
    d5_0, d40_0 = med(base, "us_d5")[0], med(base, "us_d40")[0]
    step0, tok0 = table(f, rows)
    d = rows["default"]
    window_ns = sum(x["bpf_ns"] for x in d) / len(d)
    runs = sum(x["bpf_runs"] for x in d) / len(d)
    ds, dt = med(d, "step_ms")[0] / step0, med(d, "tok_s")[0] / tok0
    f.write(f"\nThe default's programs ran {window_ns / 1e6:.2f} ms in a window ({runs:.0f} runs: PyTorch's cache asks "
            "the driver rarely), a window being several seconds of training and decoding: with two traps a call at "
            "about 1 us each (the floor's), what the default costs the model's threads is bounded by about "
            f"{(window_ns + 2 * runs * 1000) / 1e6:.2f} ms a window of 3 s or more: under 0.02%. The medians' "
            f"differences from no agent ({100 * (ds - 1):+.1f}% a step, {100 * (dt - 1):+.1f}% tokens a second) lie "
            "inside no agent's own spread from window to window.\n")
    f.write("\n## What does the tensor view add to one tensor?\n\n")
    f.write("In the same process, one `torch.empty` + `del` with the Python stack 5 and 40 frames deep (plain call "
            "chains, bench/gpu/depth.py), added over no agent (median of the rounds' medians), and that cost against "
            "the floor's. The model's own tensors cost more than this loop's: their stacks are deeper and pass a shim "
            "frame at each nn.Module level.\n\n")
    f.write("| agent | depth 5: us added | vs floor | depth 40: us added | vs floor |\n| --- | ---: | ---: | ---: | ---: |\n")
    fl5, fl40 = med(rows["floor"], "us_d5")[0] - d5_0, med(rows["floor"], "us_d40")[0] - d40_0
    for mode in ("floor", "tensors", "native", "all", "base"):
        if mode not in rows:
            continue
        a5, a40 = med(rows[mode], "us_d5")[0] - d5_0, med(rows[mode], "us_d40")[0] - d40_0
        f.write(f"| {NAMES[mode]} | {a5:+.2f} | {a5 / fl5:.2f}x | {a40:+.2f} | {a40 / fl40:.2f}x |\n")
    return ((med(rows["tensors"], "us_d5")[0] - d5_0) / fl5, (med(rows["tensors"], "us_d40")[0] - d40_0) / fl40)


def switched_off(rows):
    """In how many windows the default's driver view was switched off by its budget."""
    return sum(1 for x in rows.get("default", []) if x.get("driver_off"))


def bpf_per_run(r):
    runs, ns = sum(x["bpf_runs"] for x in r), sum(x["bpf_ns"] for x in r)
    return f"{ns / runs:.0f} ns" if runs else "-"


def driver_table(f, rows, columns):
    """One row per driver-view mode present: columns are (heading, cell of the mode's rows)."""
    f.write("| agent | " + " | ".join(h for h, _ in columns) + " | BPF run time per program run |\n")
    f.write("| --- |" + " ---: |" * (len(columns) + 1) + "\n")
    for mode in ("none", "nobudget", "default"):
        if mode in rows:
            r = rows[mode]
            f.write(f"| {NOCACHE_NAMES[mode]} | " + " | ".join(cell(r) for _, cell in columns) + f" | {bpf_per_run(r)} |\n")
    if "default" not in rows:
        return
    off = switched_off(rows)
    if off:
        f.write(f"\nThe default's driver view was switched off by its budget in {off} of {len(rows['default'])} "
                "windows; what it adds after is the probes' traps, which a library-wide attach cannot leave out of "
                "one process.\n")
    else:
        f.write("\nThe budget did not switch the default's view off in these windows: the agent is started for each "
                "window, and a window (about 6 s) ends before the budget's first 5 s are judged, so both rows are the "
                "view on and their difference is the noise; tests/gpu/run_driver_budget.sh shows the switch-off "
                "(docs/validation.md).\n")


def spread(r, key, fmt):
    m, lo, hi = med(r, key)
    return f"{m:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


def write_nocache(f, path):
    nocache = read(path)
    d0 = med(nocache["none"], "us_d5")[0]
    f.write("\n## What does the driver view cost where every tensor reaches the driver?\n\n")
    f.write("With `PYTORCH_NO_CUDA_MEMORY_CACHING=1` every tensor reaches the driver (the driver view's worst "
            f"case; the same model, {len(nocache['none'])} rounds of a shorter window). One `torch.empty` + `del` is "
            f"then one cuMemAlloc and one cuMemFree ({d0:.1f} us with no agent): what a mode adds to it is what a "
            "driver allocation and its free cost with that mode (`--driver-pair-cost`).\n\n")
    f.write(measured(path, nocache, "PYTORCH_NO_CUDA_MEMORY_CACHING=1 "))
    s0, t0 = med(nocache["none"], "step_ms")[0], med(nocache["none"], "tok_s")[0]
    driver_table(f, nocache, [("training step, ms", lambda r: spread(r, "step_ms", ".1f")),
                              ("vs none", lambda r: f"{med(r, 'step_ms')[0] / s0:.3f}x"),
                              ("decode, tokens/s", lambda r: spread(r, "tok_s", ".1f")),
                              ("vs none", lambda r: f"{med(r, 'tok_s')[0] / t0:.3f}x"),
                              ("torch.empty + del, us added", lambda r: f"{med(r, 'us_d5')[0] - d0:+.2f}")])


NOCACHE_NAMES = {
    "none": "no agent",
    "nobudget": "the driver view, never switched off (`--driver-budget=0`)",
    "default": "**the default** (`--driver-budget=0.02`: switched off when over it)",
}


def write_jax(f, path):
    if not path:
        return
    jax = read(path)
    s0, o0 = med(jax["none"], "step_ms")[0], med(jax["none"], "us_op")[0]
    f.write("\nJAX with `XLA_PYTHON_CLIENT_ALLOCATOR=platform` (every buffer is its own cuMemCreate and "
            f"cuMemRelease; a jitted 4-layer MLP's training step, {len(jax['none'])} rounds), and one "
            f"`jnp.ones` + `del` of 1 MiB ({o0:.1f} us with no agent):\n\n")
    f.write(measured(path, jax, "MODEL_SCRIPT=jax_cost.py "))
    driver_table(f, jax, [("training step, ms", lambda r: spread(r, "step_ms", ".2f")),
                          ("vs none", lambda r: f"{med(r, 'step_ms')[0] / s0:.3f}x"),
                          ("jnp.ones + del, us added", lambda r: f"{med(r, 'us_op')[0] - o0:+.2f}")])


if __name__ == "__main__":
    main()
