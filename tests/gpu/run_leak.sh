#!/usr/bin/env bash
# Leaks found live on a GPU (docs/leaks.md): the agent started first, as the
# chart runs it (the driver view; the tensor view switched on for the
# workload with gpumem tensors on), its /metrics scraped every second, and
# gpumem record beside it for the growing stacks' frames. Each MODE of
# torch_leak.py runs in turn:
#   loss, outputs  a leak: once the workload says its rate, a neighbour
#                  (torch_leak.py fill) takes the GPU but what the leak
#                  fills in LEAK_SECONDS; the workload runs until torch
#                  raises out of memory;
#   steady, generate  no leak, for SECONDS.
# check_leak.py then reads the scrapes, the workload's steps and the
# record: a leak named within 5 intervals in each view, its rate against
# memory_allocated()'s slope, the exhaustion forecast against the out of
# memory; nothing named growing without a leak.
#
# Usage: tests/gpu/run_leak.sh GPUMEM OUTDIR [MODE...]
# Environment: PYTHON (python3), SECONDS_STEADY (180: steady and generate),
# LEAK_SECONDS (150: how long the leak takes to fill the GPU).
# Needs root and a GPU.
set -uo pipefail
gpumem=$(realpath "$1")
out=$(realpath -m "$2")
shift 2
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(outputs loss steady generate)
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
seconds=${SECONDS_STEADY:-180}
leak_seconds=${LEAK_SECONDS:-150}
interval=15s # the agent's default, the chart's
metrics=127.0.0.1:9464
mkdir -p "$out"
export PYTHONUNBUFFERED=1
unset PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF
. "$here/protocol.sh"

ctl=$(mktemp -u /tmp/gpumem-leak.XXXXXX.sock)
agent='' py='' rec='' scraper='' neighbour=''
cleanup() {
	{ exec 3>&- 4>&-; } 2>/dev/null
	for pid in $py $neighbour $rec $scraper $agent; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
	rm -f "$ctl"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$gpumem" agent --metrics-address "$metrics" --pyroscope-interval "$interval" --status-interval "$interval" \
	--control-socket "$ctl" 2> >(stamp >"$out/agent.stderr") &
agent=$!
until grep -qs "serving metrics" "$out/agent.stderr"; do
	kill -0 "$agent" 2>/dev/null || { cat "$out/agent.stderr"; fail "agent ended at start"; }
	sleep 0.1
done

status=0
for mode in "${modes[@]}"; do
	log=$out/$mode
	fifo=$(mktemp -u) && mkfifo "$fifo"
	"$python" "$here/torch_leak.py" "$mode" "$seconds" <"$fifo" >"$log.stdout" 2>"$log.pyerr" &
	py=$!
	exec 3>"$fifo"
	until grep -qs '^ready' "$log.stdout"; do kill -0 "$py" 2>/dev/null || fail "$mode ended at start"; sleep 0.1; done
	echo >&3
	until grep -qs '^built' "$log.stdout"; do kill -0 "$py" 2>/dev/null || fail "$mode ended building"; sleep 0.1; done
	"$gpumem" tensors on "$py" --for 1h --budget 50% --control-socket "$ctl" >"$log.tensors" 2>&1 || fail "gpumem tensors on $py: $(cat "$log.tensors")"
	"$gpumem" record --pid "$py" --growth-interval "$interval" --format json -o "$log.record.json" --top 0 2>"$log.record.stderr" &
	rec=$!
	until grep -qs recording "$log.record.stderr"; do kill -0 "$rec" 2>/dev/null || fail "record ended at start"; sleep 0.1; done
	"$python" "$here/check_leak.py" scrape "http://$metrics/metrics" "$py" >"$log.scrapes" &
	scraper=$!
	echo >&3 # the loop begins
	case $mode in
	loss | outputs)
		until grep -qs '^rate' "$log.stdout"; do kill -0 "$py" 2>/dev/null || fail "$mode ended before its rate"; sleep 0.1; done
		rate=$(sed -n 's/^rate //p' "$log.stdout" | "$python" -c 'import json,sys; print(int(json.load(sys.stdin)["bytes_per_second"]))')
		nfifo=$(mktemp -u) && mkfifo "$nfifo"
		"$python" "$here/torch_leak.py" fill $((rate * leak_seconds)) <"$nfifo" >"$log.neighbour" 2>&1 &
		neighbour=$!
		exec 4>"$nfifo"
		until grep -qs '^filled' "$log.neighbour"; do kill -0 "$neighbour" 2>/dev/null || fail "the neighbour ended: $(cat "$log.neighbour")"; sleep 0.1; done
		wait "$py"
		exec 4>&-
		wait "$neighbour"
		rm -f "$nfifo"
		;;
	*)
		wait "$py"
		;;
	esac
	exec 3>&-
	rm -f "$fifo"
	kill -INT "$rec" && wait "$rec"
	kill "$scraper" && wait "$scraper" 2>/dev/null
	py='' rec='' scraper='' neighbour=''
	"$python" "$here/check_leak.py" check "$mode" "$log" "$out/agent.stderr" "${interval%s}" || status=1
done
kill -TERM "$agent" && wait "$agent"
agent=''
[ $status -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit $status
