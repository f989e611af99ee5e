#!/usr/bin/env bash
# What a tensor pair costs the traced loop itself (pairs.py's wall time a
# pair, "felt"), beside the programs' run time a run, for builds side by
# side on the simulated allocator: whether a pair costs its caller more
# than its programs run (caches and predictors they displace). ROUNDS
# rounds (default 3) of: no agent, the floor (bench/usdtfloor's empty
# programs on the same USDT sites, built at USDTFLOOR), then each build's
# agent with --tensors=all; the agent on CPU 0, the loop on CPU 1. DEPTH
# (default 40), PAIRS_STACK, PAIRS_TOUCH, PAIRS_WORK and N as pairs.py says. Prints
# "mode=... ns_per_pair=... ns_per_run=..." lines. As root, after make
# build and make sim. Usage: bench/tensorruns/felt.sh USDTFLOOR GPUMEM...
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sim=$root/build/sim
export SIMCUDA_LIB=$sim/libcuda.so.1 SIMTORCH_LIB=$sim/libc10_cuda.so LD_LIBRARY_PATH=$sim
python=${PYTHON:-python3}
floor=$1
shift
sysctl -qw kernel.bpf_stats_enabled=1
out=$(mktemp -d)

source "$root/bench/tensorruns/agent.sh"

# start MODE: starts what MODE traces with (none: nothing) and waits until
# it is attached; its PID in tracer, stopped when this shell exits.
start() {
	tracer=
	case $1 in
	none) ;;
	floor) start_attached "$out/attach.log" attached taskset -c 0 "$floor" "$sim/libc10_cuda.so" ;;
	*) start_agent "$out/attach.log" taskset -c 0 "$1" ;;
	esac
}

# measure MODE: one window of pairs.py under MODE.
measure() {
	local ns runs=-
	start "$1"
	coproc W { taskset -c 1 "$python" "$root/bench/tensorruns/pairs.py" "${DEPTH:-40}"; }
	local loop=$W_PID
	read -r _ <&"${W[0]}"
	echo >&"${W[1]}"
	read -r _ ns <&"${W[0]}"
	wait "$loop"
	if [ -n "$tracer" ]; then
		runs=$(run_time "$tracer" "${N:-100000}")
		kill -INT "$tracer"
		wait "$tracer" || true
	fi
	echo "mode=$1 depth=${DEPTH:-40} touch=${PAIRS_TOUCH:-0} ns_per_pair=${ns%.*} ns_per_run=$runs"
}

for ((r = 0; r < ${ROUNDS:-3}; r++)); do
	for mode in none floor "$@"; do
		measure "$mode"
	done
done
