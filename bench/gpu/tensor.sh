#!/usr/bin/env bash
# The tensor path's cost, measured inside one process by tensor_cost.py: with
# the caching allocator on, gpumem's USDT probes fire on every torch.empty
# and del. Three processes; prints "round=N result phase=... us_per_empty=..."
# lines. USDTFLOOR is bench/usdtfloor built (CGO_ENABLED=0 go build).
# Usage: bench/gpu/tensor.sh GPUMEM USDTFLOOR OUTDIR
set -euo pipefail
gpumem=$1
floor=$2
out=$3
here=$(cd "$(dirname "$0")" && pwd)
unset PYTORCH_NO_CUDA_MEMORY_CACHING

loop_cpu=$(($(nproc) - 1))
profiler_cpus=0-$((loop_cpu - 1))

# lines PREFIX: how many lines of the script's output start with PREFIX.
lines() { grep -c "^$1" "$out/tensor.stdout" || true; }

for round in 1 2 3 4 5; do
	fifo=$(mktemp -u) && mkfifo "$fifo"
	# The loop on one CPU, the profilers on others: a loop that moves between
	# CPUs runs at about 2.3 or about 4.5 us an iteration, phase to phase.
	taskset -c "$loop_cpu" python3 "$here/tensor_cost.py" <"$fifo" >"$out/tensor.stdout" &
	py=$!
	exec 3>"$fifo"
	until grep -q ready "$out/tensor.stdout"; do sleep 0.1; done
	# The script names each phase before it runs it (tensor_cost.py's PHASES).
	n=0
	while :; do
		until [ "$(lines phase)" -gt $n ]; do
			kill -0 $py 2>/dev/null || break 2
			sleep 0.1
		done
		n=$((n + 1))
		phase=$(grep '^phase' "$out/tensor.stdout" | sed -n "${n}p" | cut -d' ' -f2)
		rec=
		case $phase in
		floor)
			: >"$out/floor.stdout"
			taskset -c "$profiler_cpus" "$floor" "$(grep -m1 -o '/[^ ]*libc10_cuda.so' /proc/$py/maps)" >"$out/floor.stdout" &
			rec=$!
			until grep -qs attached "$out/floor.stdout"; do sleep 0.1; done ;;
		gpumem*)
			flags=()
			[ "$phase" = gpumem_native ] && flags=(--tensor-native-stacks)
			: >"$out/tensor.stderr"
			taskset -c "$profiler_cpus" "$gpumem" record --pid "$py" "${flags[@]}" --format json -o "$out/tensor.json" --top 0 2>"$out/tensor.stderr" &
			rec=$!
			until grep -q "PyTorch allocator probes" "$out/tensor.stderr"; do sleep 0.1; done ;;
		esac
		echo >&3
		until [ "$(lines result)" -ge $n ]; do sleep 0.1; done
		if [ -n "$rec" ]; then kill -INT $rec && wait $rec; fi
	done
	exec 3>&-
	wait $py || echo "tensor_cost.py exited with $?" >&2
	rm -f "$fifo"
	grep result "$out/tensor.stdout" | sed "s/^/round=$round /"
done
