#!/usr/bin/env bash
# The tensor path's cost, measured inside one process by tensor_cost.py: with
# the caching allocator on, gpumem's USDT probes fire on every torch.empty
# and del. Three processes; prints "round=N result phase=... us_per_empty=..."
# lines. Usage: bench/gpu/tensor.sh GPUMEM OUTDIR
set -euo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
unset PYTORCH_NO_CUDA_MEMORY_CACHING

# lines PREFIX: how many lines of the script's output start with PREFIX.
lines() { grep -c "^$1" "$out/tensor.stdout" || true; }

for round in 1 2 3; do
	fifo=$(mktemp -u) && mkfifo "$fifo"
	python3 "$here/tensor_cost.py" <"$fifo" >"$out/tensor.stdout" &
	py=$!
	exec 3>"$fifo"
	until grep -q ready "$out/tensor.stdout"; do sleep 0.1; done
	for phase in base gpumem base history; do
		until [ "$(lines phase)" -gt "$(lines result)" ]; do sleep 0.1; done
		if [ "$phase" = gpumem ]; then
			"$gpumem" record --pid "$py" --format json -o "$out/tensor.json" --top 0 2>"$out/tensor.stderr" &
			rec=$!
			until grep -q "PyTorch allocator probes" "$out/tensor.stderr"; do sleep 0.1; done
		fi
		echo >&3
		n=$(lines result)
		until [ "$(lines result)" -gt "$n" ]; do sleep 0.1; done
		if [ "$phase" = gpumem ]; then kill -INT $rec && wait $rec; fi
	done
	exec 3>&-
	wait $py || echo "tensor_cost.py exited with $?" >&2
	rm -f "$fifo"
	grep result "$out/tensor.stdout" | sed "s/^/round=$round /"
done
