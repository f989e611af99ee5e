#!/usr/bin/env bash
# The tensor view on a GPU, with PyTorch's caching allocator on: gpu-mem's
# live tensor bytes per innermost frame against torch.cuda.memory._snapshot()
# (torch_tensors.py, check_tensors.py), then a deliberate out-of-memory and
# its snapshot (torch_oom.py, check_oom.py).
# Usage: tests/gpu/run_tensors.sh GPUMEM OUTDIR
set -uo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
unset PYTORCH_NO_CUDA_MEMORY_CACHING
status=0

# run SCRIPT NAME [gpumem record flags]: the script's protocol under record.
run() {
	local script=$1 name=$2
	shift 2
	local log=$out/$name fifo
	fifo=$(mktemp -u) && mkfifo "$fifo"
	python3 "$here/$script" "$log.snapshot.json" <"$fifo" >"$log.stdout" &
	local py=$!
	exec 3>"$fifo"
	until grep -q ready "$log.stdout"; do sleep 0.1; done
	"$gpumem" record --pid "$py" --format json -o "$log.json" --top 3 "$@" 2>"$log.stderr" &
	local rec=$!
	until grep -q "PyTorch allocator probes" "$log.stderr" && grep -q "Python" "$log.stderr"; do sleep 0.1; done
	echo >&3
	until grep -q expect "$log.stdout"; do sleep 0.1; done
	kill -INT $rec && wait $rec
	echo >&3 && exec 3>&- && wait $py
	rm -f "$fifo"
	cat "$log.stderr"
}

run torch_tensors.py tensors
echo "== tensors against torch.cuda.memory._snapshot()"
python3 "$here/check_tensors.py" "$out/tensors.json" "$out/tensors.snapshot.json" || status=1

mkdir -p "$out/oom"
run torch_oom.py oom --on-oom "$out/oom"
echo "== out of memory"
python3 "$here/check_oom.py" "$out/oom.json" "$(grep expect "$out/oom.stdout")" || status=1
ls -la "$out/oom"
head -5 "$out"/oom/*.folded
exit $status
