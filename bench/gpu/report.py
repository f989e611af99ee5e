"""Writes RESULTS.md, the GPU section of BENCHMARKS.md, from the lines
bench/gpu/run.sh collected.

Usage: report.py RESULTS_TXT TENSOR_TXT RESULTS_MD
"""
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kv = dict(x.split("=") for x in line.split()[1:])
    runs.setdefault((kv["caching"], kv["profiler"]), []).append((float(kv["us_per_empty"]), float(kv["ms_per_step"])))
rows = {k: (statistics.median(e for e, _ in v), statistics.median(s for _, s in v)) for k, v in runs.items()}
gpu = open("/proc/driver/nvidia/gpus/" + __import__("os").listdir("/proc/driver/nvidia/gpus")[0] + "/information").read().split("\n")[0].split(":", 1)[1].strip()
with open(sys.argv[3], "w") as f:
    f.write("## How does it compare with PyTorch's own `_record_memory_history`?\n\n")
    f.write("`torch.empty` of 1 MiB then `del`, and a 4-layer transformer encoder's training step (d_model 512, batch\n")
    f.write("16 x 256 tokens), with no profiler, under gpu-mem and with PyTorch's `_record_memory_history`, the caching\n")
    f.write("allocator on and off: each figure the median of 3 interleaved rounds of the best of 5 repeats.\n\n")
    f.write(f"Measured on {gpu}, torch {__import__('torch').__version__}, by `bench/gpu/run.sh GPUMEM USDTFLOOR OUT` on the\n")
    f.write("GPU machine (raw lines: OUT/results.txt and OUT/tensor.txt, kept in `bench/gpu/`).\n\n")
    f.write("| caching allocator | profiler | us per empty+del | slowdown | ms per model step | slowdown |\n")
    f.write("| --- | --- | ---: | ---: | ---: | ---: |\n")
    ok2, below = True, True
    for caching in ("1", "0"):
        base = rows[(caching, "none")]
        for profiler in ("none", "gpumem", "history"):
            e, s = rows[(caching, profiler)]
            name = {"none": "none", "gpumem": "gpu-mem", "history": "`_record_memory_history`"}[profiler]
            f.write(f"| {'on' if caching == '1' else 'off'} | {name} | {e:.2f} | {100 * (e / base[0] - 1):+.1f}% | {s:.2f} | {100 * (s / base[1] - 1):+.1f}% |\n")
        g, h = rows[(caching, "gpumem")], rows[(caching, "history")]
        below = below and g[0] - base[0] < h[0] - base[0]
        if caching == "1":
            ok2 = g[1] / base[1] <= 1.02
    f.write(f"\nTargets: the model step at most 2% slower with caching on ({'met' if ok2 else 'missed'}); below\n")
    f.write(f"`_record_memory_history`'s overhead in every configuration ({'met' if below else 'missed'}).\n")
    # The tensor path, in one process per round: added = phase - mean of the two base phases.
    phases = {}
    for line in open(sys.argv[2]):
        kv = dict(x.split("=") for x in line.split() if "=" in x)
        phases.setdefault(line.split()[0], []).append((kv["phase"], float(kv["us_per_empty"])))
    # Each profiled phase against the base phases beside it (history, last,
    # has one).
    added = {"floor": [], "gpumem": [], "gpumem_native": [], "history": []}
    for rnd in phases.values():
        for i, (p, v) in enumerate(rnd):
            if p in added:
                beside = [rnd[j][1] for j in (i - 1, i + 1) if 0 <= j < len(rnd) and rnd[j][0] == "base"]
                added[p].append(v - statistics.mean(beside))
    med = {p: statistics.median(v) for p, v in added.items()}
    g, h = med["gpumem"], med["history"]
    f.write("\n### The tensor path\n\n")
    f.write("With the caching allocator on, gpu-mem's probes on PyTorch's allocator (USDT `pytorch:malloc` and `pytorch:free`)\n")
    f.write("fire on every `torch.empty` and `del`. Measured by `bench/gpu/tensor_cost.py` inside one process, phases in turn:\n")
    f.write("each profiled phase between two unprofiled ones: empty programs on the same USDT sites (the floor: two traps,\n")
    f.write("`bench/usdtfloor`), gpu-mem attached, gpu-mem with `--tensor-native-stacks`, `_record_memory_history`; added\n")
    f.write("cost = phase minus the mean of the unprofiled phases beside it; median of 5 processes, the loop pinned to one CPU\n")
    f.write("and the profilers to others.\n\n")
    f.write("| profiler | us added per empty+del | rounds |\n| --- | ---: | --- |\n")
    for p, name in (("floor", "floor: empty programs on the two probes"), ("gpumem", "gpu-mem (tensor view)"),
                    ("gpumem_native", "gpu-mem, `--tensor-native-stacks`"), ("history", "`_record_memory_history`")):
        f.write(f"| {name} | {med[p]:.2f} | {', '.join(f'{x:.2f}' for x in added[p])} |\n")
    f.write(f"\nTargets: under 2 us added ({'met' if g < 2 else 'missed'}); below PyTorch's own ({'met' if g < h else 'missed'}).\n")
