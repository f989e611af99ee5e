#!/usr/bin/env bash
# The GPU part of the benchmarks (run on the GPU machine, from the repository
# root): torch.empty + del and a small transformer's training step, without a
# profiler, under gpumem, and with PyTorch's _record_memory_history, with the
# caching allocator on and off. Writes RESULTS.md (the section `make bench`
# copies into BENCHMARKS.md) to OUTDIR.
# Usage: bench/gpu/run.sh GPUMEM OUTDIR
set -euo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
lib=$(ls /usr/local/nvidia/lib64/libcuda.so.* /usr/lib/x86_64-linux-gnu/libcuda.so.* 2>/dev/null | head -1 || true)
results=$out/results.txt
: >"$results"
# Three rounds, the variants interleaved in each, so that drift of the
# machine falls on all of them alike; RESULTS.md has the median of rounds.
for round in 1 2 3; do
for caching in 1 0; do
	if [ "$caching" = 0 ]; then export PYTORCH_NO_CUDA_MEMORY_CACHING=1; else unset PYTORCH_NO_CUDA_MEMORY_CACHING; fi
	for profiler in none gpumem history; do
		if [ "$profiler" = gpumem ]; then
			"$gpumem" record --library "$lib" --format json -o "$out/bench-caching$caching.json" --top 0 \
				-- python3 "$here/torch_bench.py" gpumem | grep result >>"$results"
		else
			python3 "$here/torch_bench.py" "$profiler" | grep result >>"$results"
		fi
	done
done
done
cat "$results"
python3 - "$results" "$out/RESULTS.md" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kv = dict(x.split("=") for x in line.split()[1:])
    runs.setdefault((kv["caching"], kv["profiler"]), []).append((float(kv["us_per_empty"]), float(kv["ms_per_step"])))
rows = {k: (statistics.median(e for e, _ in v), statistics.median(s for _, s in v)) for k, v in runs.items()}
gpu = open("/proc/driver/nvidia/gpus/" + __import__("os").listdir("/proc/driver/nvidia/gpus")[0] + "/information").read().split("\n")[0].split(":", 1)[1].strip()
with open(sys.argv[2], "w") as f:
    f.write("## On the GPU\n\n")
    f.write(f"{gpu}, torch {__import__('torch').__version__}, measured by `bench/gpu/run.sh`: each figure is the median of\n")
    f.write("3 interleaved rounds of the best of 5 repeats. `torch.empty` of 1 MiB then `del`; a 4-layer transformer encoder\n")
    f.write("(d_model 512, batch 16 x 256 tokens) training step. Slowdown is relative to no profiler.\n\n")
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
            ok2 = g[0] / base[0] <= 1.02
    f.write(f"\nTargets: at most 2% slower with caching on ({'met' if ok2 else 'missed'}); below\n")
    f.write(f"`_record_memory_history`'s overhead in every configuration ({'met' if below else 'missed'}).\n")
PY
cat "$out/RESULTS.md"
