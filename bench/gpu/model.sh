#!/usr/bin/env bash
# What the agent costs a real model (model_cost.py), every mode measured in
# one Python process: the agent is started before each window and stopped
# after it, ROUNDS rounds of MODES, the modes rotated from round to round
# so that none always follows another. With kernel.bpf_stats_enabled on,
# each window also records the agent's BPF programs' run counts and run
# time (from its file descriptors' fdinfo) and the agent's own CPU time.
# Prints "round=N result mode=... ... bpf_runs=... bpf_ns=... agent_cpu_ms=..."
# lines.
#
# Modes: none (no agent), floor (empty programs on the same USDT sites:
# the traps alone, bench/usdtfloor), default (gpumem agent as the chart runs it by
# default: the driver view, the tensor view on demand), driver (--tensors=off),
# all (--tensors=all: the tensor view for every process, the default before),
# tensors (the tensor view switched on for the model's process), native
# (the same with --tensor-native-stacks), base (BASE_GPUMEM agent with its
# defaults, or BASE_FLAGS, PID replaced by the model's: another build, e.g.
# the one before a change, side by side; base2, base3 ... likewise with
# BASE2_GPUMEM, BASE3_GPUMEM ...),
# state (the default with its state kept for the next agent: --state-dir
# and --pin-path on a BPF file system of the run's own, cleared after each
# window so that no probe stays for the next), nobudget (the default with
# --driver-budget=0: the driver view never
# switched off, whatever it costs; against default where every tensor
# reaches the driver, PYTORCH_NO_CUDA_MEMORY_CACHING=1).
# Usage: bench/gpu/model.sh GPUMEM USDTFLOOR OUTDIR
# Environment: MODEL_SCRIPT (default model_cost.py; jax_cost.py for JAX's
# platform allocator), ROUNDS (default 5), MODES (default "none default tensors native"),
# BASE_GPUMEM (for mode base), PYTORCH_NO_CUDA_MEMORY_CACHING and
# PYTORCH_CUDA_ALLOC_CONF (passed to the model, as MODEL_STEPS, MODEL_TOKENS
# and MODEL_EMPTIES are), TENSORS_FLAGS (how the tensors mode switches the view on; default
# "--tensor-pid PID", PID replaced by the model's).
set -euo pipefail
gpumem=$1
floor=$2
out=$3
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-5}
read -ra modes <<<"${MODES:-none default tensors native}"
tensor_flags=${TENSORS_FLAGS:---tensor-pid PID}
BASE_FLAGS=${BASE_FLAGS:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
sysctl -qw kernel.bpf_stats_enabled=1 || echo "model.sh: no BPF run time (kernel.bpf_stats_enabled)" >&2
# The machine the lines were measured on, which model_report.py names.
echo "# machine: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) CPUs, kernel $(uname -r)"

# The state mode's BPF file system and state directory.
bpffs=$(mktemp -d /tmp/model-bpf.XXXXXX) statedir=$(mktemp -d /tmp/model-state.XXXXXX)
if [[ " ${modes[*]} " == *" state "* ]]; then mount -t bpf bpf "$bpffs"; fi
trap 'umount "$bpffs" 2>/dev/null; rm -rf "$bpffs" "$statedir"' EXIT

# The windows, in order: each round the modes shifted by one.
windows=()
for ((r = 0; r < rounds; r++)); do
	for ((i = 0; i < ${#modes[@]}; i++)); do
		windows+=("${modes[$(((i + r) % ${#modes[@]}))]}")
	done
done

# bpf_stats PID: "runs ns" summed over the BPF programs PID holds.
bpf_stats() {
	local f runs=0 ns=0 r n
	for f in /proc/"$1"/fdinfo/*; do
		grep -q '^prog_type' "$f" 2>/dev/null || continue
		r=$(awk '/^run_cnt/ {print $2}' "$f")
		n=$(awk '/^run_time_ns/ {print $2}' "$f")
		runs=$((runs + ${r:-0})) ns=$((ns + ${n:-0}))
	done
	echo "$runs $ns"
}

# cpu_ms PID: the process's user and system CPU time so far.
cpu_ms() {
	awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / hz)}' /proc/"$1"/stat
}

# The model's main thread on a CPU of its own (model_cost.py pins it once
# its other threads run), the agent on the others: a thread that moves
# between CPUs runs a loop of torch.empty at about 2.3 or about 4.5 us an
# iteration, window to window, more than any agent costs.
export MODEL_CPU=$(($(nproc) - 1))
agent_cpus=0-$((MODEL_CPU - 1))
fifo=$(mktemp -u) && mkfifo "$fifo"
python3 "${MODEL_SCRIPT:-$here/model_cost.py}" "${windows[@]}" <"$fifo" >"$out/model.stdout" 2>"$out/model.stderr" &
py=$!
exec 3>"$fifo"
until grep -q ready "$out/model.stdout"; do
	kill -0 $py 2>/dev/null || { cat "$out/model.stderr" >&2; exit 1; }
	sleep 0.2
done
n=0
round=1
for mode in "${windows[@]}"; do
	n=$((n + 1))
	until [ "$(grep -c '^window' "$out/model.stdout")" -ge $n ]; do sleep 0.1; done
	agent=
	flags=()
	case $mode in
	default) ;;
	driver) flags=(--tensors=off) ;;
	nobudget) flags=(--driver-budget=0) ;;
	state) flags=(--state-dir "$statedir" --pin-path "$bpffs/gpu-mem") ;;
	all) flags=(--tensors=all) ;;
	tensors) read -ra flags <<<"${tensor_flags//PID/$py}" ;;
	native) read -ra flags <<<"${tensor_flags//PID/$py} --tensor-native-stacks" ;;
	base*) read -ra flags <<<"${BASE_FLAGS//PID/$py}" ;;
	esac
	bin=$gpumem
	if [[ $mode == base* ]]; then var="${mode^^}_GPUMEM" && bin=${!var}; fi
	if [ "$mode" = floor ]; then
		taskset -c "$agent_cpus" "$floor" "$(grep -m1 -o '/[^ ]*libc10_cuda.so' /proc/$py/maps)" >"$out/floor.stdout" &
		agent=$!
		until grep -qs attached "$out/floor.stdout"; do sleep 0.1; done
		cpu0=$(cpu_ms $agent)
	elif [ "$mode" != none ]; then
		: >"$out/agent.stderr"
		taskset -c "$agent_cpus" "$bin" agent "${flags[@]}" 2>"$out/agent.stderr" &
		agent=$!
		# Attached once the driver in the model's process is (and, with
		# the tensor view, its allocator).
		want="driver functions"
		case $mode in tensors | native | all | base*) want="PyTorch allocator probes" ;; esac
		until grep -q "$want" "$out/agent.stderr"; do
			kill -0 $agent 2>/dev/null || { cat "$out/agent.stderr" >&2; exit 1; }
			sleep 0.1
		done
		cpu0=$(cpu_ms $agent)
	fi
	echo >&3
	until [ "$(grep -c '^result' "$out/model.stdout")" -ge $n ]; do
		kill -0 $py 2>/dev/null || { cat "$out/model.stderr" >&2; exit 1; }
		sleep 0.1
	done
	extra="bpf_runs=0 bpf_ns=0 agent_cpu_ms=0"
	if [ -n "$agent" ]; then
		read -r runs ns <<<"$(bpf_stats $agent)"
		extra="bpf_runs=$runs bpf_ns=$ns agent_cpu_ms=$(($(cpu_ms $agent) - cpu0))"
		# The driver view switched off by its budget during the window.
		if grep "driver view off: over budget" "$out/agent.stderr" >>"$out/driver-off.log"; then
			extra="$extra driver_off=1"
		fi
		kill -INT $agent && wait $agent || true
		if [ "$mode" = state ]; then "$bin" state clear --state-dir "$statedir" --pin-path "$bpffs/gpu-mem" >/dev/null; fi
	fi
	echo "round=$round $(grep '^result' "$out/model.stdout" | sed -n "${n}p") $extra"
	[ $((n % ${#modes[@]})) -eq 0 ] && round=$((round + 1))
done
exec 3>&-
wait $py
rm -f "$fifo"
