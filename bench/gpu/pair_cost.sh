#!/usr/bin/env bash
# What the tensor view adds to one torch.empty + del against the floor (the
# traps alone: empty programs on the same USDT sites, bench/usdtfloor), as
# a user of the running agent feels it, in ONE process (pair_cost.py) and
# with ONE agent running as the chart runs it: each round measures the modes
# none (the agent's default, the process's tensor view off: no trap
# fires), floor and tensors (`gpumem tensors on PID`) in windows seconds
# apart, rotated from round to round. A window is too short for the
# machine to drift, so each round's differences from its own none are read,
# not the modes' medians across minutes. Prints "round=N result mode=...
# us_d5=... us_d40=... [bpf_runs_d5=... bpf_ns_d5=... bpf_runs_d40=...
# bpf_ns_d40=...]" lines (the tensor program's, or the floor's busiest
# program's, runs and run time at each depth), then pair_report.py's
# summary.
# Usage: bench/gpu/pair_cost.sh GPUMEM USDTFLOOR OUTDIR
# Environment: ROUNDS (default 20), AGENT_FLAGS (added to `gpumem agent`,
# e.g. --library for the simulated driver), PAIR_ALLOCATOR and EMPTIES
# (passed to pair_cost.py).
set -euo pipefail
gpumem=$1
floor=$2
out=$3
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-20}
modes=(none floor tensors)
read -ra agent_flags <<<"${AGENT_FLAGS:-}"
mkdir -p "$out"
: >"$out/lines"
sysctl -qw kernel.bpf_stats_enabled=1 || echo "pair_cost.sh: no BPF run time (kernel.bpf_stats_enabled)" >&2

# bpf_stats PID: "id runs ns" of each BPF program PID holds.
bpf_stats() {
	local f
	for f in /proc/"$1"/fdinfo/*; do
		grep -q '^prog_type' "$f" 2>/dev/null || continue
		awk '/^prog_id/ {id = $2} /^run_cnt/ {runs = $2} /^run_time_ns/ {ns = $2} END {print id, runs, ns}' "$f"
	done
}

# busiest BEFORE AFTER: "runs ns" of the program that ran most between two
# bpf_stats: the tensor probes' (the others run once a driver call).
busiest() {
	awk 'NR == FNR {runs[$1] = $2; ns[$1] = $3; next}
		$2 - runs[$1] > best {best = $2 - runs[$1]; t = $3 - ns[$1]}
		END {print best + 0, t + 0}' <(echo "$1") <(echo "$2")
}

# wait_for FILE PATTERN COUNT PID: until FILE has COUNT lines matching
# PATTERN, while PID lives.
wait_for() {
	local seen
	until seen=$(grep -sc "$2" "$1") || true; [ "${seen:-0}" -ge "$3" ]; do
		kill -0 "$4" 2>/dev/null || { echo "pair_cost.sh: process $4 ended" >&2 && cat "$out"/*.stderr >&2 && exit 1; }
		sleep 0.05
	done
}

# The measuring thread on a CPU of its own, the agent on the others, as
# model.sh does.
export MODEL_CPU=$(($(nproc) - 1))
agent_cpus=0-$((MODEL_CPU - 1))
fifo=$(mktemp -u) && mkfifo "$fifo"
python3 "$here/pair_cost.py" <"$fifo" >"$out/pairs.stdout" 2>"$out/pairs.stderr" &
py=$!
exec 3>"$fifo"
wait_for "$out/pairs.stdout" '^ready' 1 $py

socket=$out/control.sock
taskset -c "$agent_cpus" "$gpumem" agent --control-socket "$socket" --metrics-address "" "${agent_flags[@]}" 2>"$out/agent.stderr" &
agent=$!
trap 'kill -INT $agent 2>/dev/null; exec 3>&-' EXIT
wait_for "$out/agent.stderr" 'driver functions' 1 $agent
until [ -S "$socket" ]; do sleep 0.05; done

n=0
ons=0
for ((r = 1; r <= rounds; r++)); do
	for ((i = 0; i < ${#modes[@]}; i++)); do
		mode=${modes[$(((i + r) % ${#modes[@]}))]}
		n=$((n + 1))
		case $mode in
		floor)
			taskset -c "$agent_cpus" "$floor" "$(grep -m1 -o '/[^ ]*libc10_cuda.so' /proc/$py/maps)" >"$out/floor.stdout" 2>"$out/floor.stderr" &
			fl=$!
			wait_for "$out/floor.stdout" attached 1 $fl
			;;
		tensors)
			"$gpumem" tensors on $py --control-socket "$socket" >/dev/null
			ons=$((ons + 1))
			wait_for "$out/agent.stderr" "pid $py: tensor view on since" $ons $agent
			;;
		esac
		probes=$agent
		[ "$mode" = floor ] && probes=$fl
		before=$(bpf_stats $probes)
		echo "$mode" >&3
		wait_for "$out/pairs.stdout" '^half' $n $py
		half=$(bpf_stats $probes)
		echo >&3
		wait_for "$out/pairs.stdout" '^result' $n $py
		after=$(bpf_stats $probes)
		extra=
		if [ "$mode" != none ]; then
			read -r runs ns <<<"$(busiest "$before" "$half")"
			extra=" bpf_runs_d5=$runs bpf_ns_d5=$ns"
			read -r runs ns <<<"$(busiest "$half" "$after")"
			extra="$extra bpf_runs_d40=$runs bpf_ns_d40=$ns"
		fi
		case $mode in
		floor) kill -INT $fl && wait $fl || true ;;
		tensors) "$gpumem" tensors off $py --control-socket "$socket" >/dev/null ;;
		esac
		echo "round=$r $(grep '^result' "$out/pairs.stdout" | sed -n "${n}p")$extra" | tee -a "$out/lines"
	done
done
python3 "$here/pair_report.py" "$out/lines"
