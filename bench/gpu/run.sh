#!/usr/bin/env bash
# The GPU part of the benchmarks (run on the GPU machine, from the repository
# root): torch.empty + del and a small transformer's training step, without a
# profiler, under gpumem, and with PyTorch's _record_memory_history, with the
# caching allocator on and off. Writes RESULTS.md (the section `make bench`
# copies into BENCHMARKS.md) to OUTDIR.
# Usage: bench/gpu/run.sh GPUMEM USDTFLOOR OUTDIR (USDTFLOOR: bench/usdtfloor built)
set -euo pipefail
gpumem=$1
floor=$2
out=$3
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
# The tensor path, measured inside one process (bench/gpu/tensor.sh).
tensor=$out/tensor.txt
"$here/tensor.sh" "$gpumem" "$floor" "$out" >"$tensor"
cat "$results" "$tensor"
python3 "$here/report.py" "$results" "$tensor" "$out/RESULTS.md"
cat "$out/RESULTS.md"
