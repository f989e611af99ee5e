#!/usr/bin/env bash
# The tensor view under CUDA graphs (issue 32): a transformers Llama under
# torch.compile's reduce-overhead and max-autotune (Inductor's CUDA graph
# trees: checkpoint restores, raw frees), inference and training, several
# shapes; and torch.cuda.graph with a shared pool. For each scenario of
# torch_graph_trees.py, two gpumem records of the process: one stopped midway
# ("live"), one at the end; check_graphs.py compares each with torch's
# requested_bytes current and peak at that moment, and the driver view's
# CUDA graph pool part with the bytes of torch's segments in private pools
# (torch.cuda.memory_snapshot()'s segment_pool_id not (0, 0)): PASS or FAIL
# lines, two per record.
# Usage: tests/gpu/run_graphs.sh GPUMEM OUTDIR [SCENARIO...]
# (default: every scenario; each runs in its own process, a few minutes each
# for max-autotune's compilation).
set -uo pipefail
gpumem=$1
out=$2
shift 2
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(graph-pool reduce-overhead-infer reduce-overhead-train max-autotune-infer max-autotune-train)
here=$(cd "$(dirname "$0")" && pwd)
unset PYTORCH_NO_CUDA_MEMORY_CACHING
mkdir -p "$out"
status=0

# waitfor FILE PATTERN PID: until FILE has PATTERN; 1 if PID ends first.
waitfor() {
	until grep -q "$2" "$1" 2>/dev/null; do
		kill -0 "$3" 2>/dev/null || { echo "FAIL $(basename "$1"): ended before $2" >&2; return 1; }
		sleep 0.2
	done
}

for sc in "${scenarios[@]}"; do
	log=$out/$sc
	fifo=$(mktemp -u) && mkfifo "$fifo"
	python3 "$here/torch_graph_trees.py" "$sc" <"$fifo" >"$log.stdout" 2>"$log.pyerr" &
	py=$!
	exec 3>"$fifo"
	waitfor "$log.stdout" ready $py || { status=1; continue; }
	recs=()
	for part in live end; do
		"$gpumem" record --pid "$py" --format json -o "$log.$part.json" --top 0 2>"$log.$part.stderr" &
		recs+=($!)
	done
	for part in live end; do
		waitfor "$log.$part.stderr" "PyTorch allocator probes" $py && waitfor "$log.$part.stderr" "Python" $py || status=1
	done
	grep -h "PyTorch allocator probes" "$log.end.stderr"
	echo >&3
	if waitfor "$log.stdout" '^live' $py; then
		kill -INT "${recs[0]}" && wait "${recs[0]}"
		echo >&3
		waitfor "$log.stdout" '^expect' $py || status=1
	else
		status=1
	fi
	kill -INT "${recs[1]}" 2>/dev/null && wait "${recs[1]}"
	echo >&3
	exec 3>&-
	wait $py || { echo "FAIL $sc: exit status"; tail -20 "$log.pyerr"; status=1; }
	rm -f "$fifo"
	echo "== $sc"
	python3 "$here/check_graphs.py" "$sc live" "$log.live.json" "$py" "$(grep '^live' "$log.stdout")" || status=1
	python3 "$here/check_graphs.py" "$sc end" "$log.end.json" "$py" "$(grep '^expect' "$log.stdout")" || status=1
done
exit $status
