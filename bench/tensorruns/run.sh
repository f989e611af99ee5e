#!/usr/bin/env bash
# The tensor program's own run time (kernel.bpf_stats_enabled), alloc and
# free runs averaged, for builds side by side: ROUNDS rounds (default 5),
# each build in turn at Python depth 5 and 40, 100,000 pairs each
# (pairs.py; N changes it, 100,000 at least), every build's agent with
# --tensors=all on the simulated driver and allocator. Prints "BUILD
# depth=D ns_per_run=X" lines and, at the end, each build's median at each
# depth. As root, after make build and make sim; PAIRS_STACK and
# PAIRS_TOUCH as pairs.py says. Needs no bpftool: it runs on the GPU
# machine too. Usage: bench/tensorruns/run.sh GPUMEM...
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sim=$root/build/sim
export SIMCUDA_LIB=$sim/libcuda.so.1 SIMTORCH_LIB=$sim/libc10_cuda.so LD_LIBRARY_PATH=$sim
python=${PYTHON:-python3}
sysctl -qw kernel.bpf_stats_enabled=1
out=$(mktemp -d)

source "$root/bench/tensorruns/agent.sh"

# runs GPUMEM DEPTH: the run time per run of the agent's gpumem_tensor.
runs() {
	start_agent "$out/agent.log" "$1"
	coproc W { "$python" "$root/bench/tensorruns/pairs.py" "$2"; }
	read -r _ <&"${W[0]}"
	echo >&"${W[1]}"
	read -r _ <&"${W[0]}"
	run_time $tracer 200000
	kill -INT $tracer
	wait $tracer || true
}

for ((r = 0; r < ${ROUNDS:-5}; r++)); do
	for bin in "$@"; do
		for depth in 5 40; do
			echo "$bin depth=$depth ns_per_run=$(runs "$bin" $depth)" | tee -a "$out/lines"
		done
	done
done
echo "medians:"
sort "$out/lines" | awk '{split($3, v, "="); k = $1 " " $2; a[k] = a[k] " " v[2]} END {for (k in a) print k, a[k]}' |
	while read -r bin depth values; do
		echo "$bin $depth median=$(tr ' ' '\n' <<<"$values" | sort -n | awk '{x[NR] = $1} END {print x[int((NR + 1) / 2)]}')"
	done
