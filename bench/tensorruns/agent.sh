# Sourced by run.sh and felt.sh, which set sim (the simulated driver's
# folder).

# start_attached LOG WORD CMD...: starts CMD..., its output in LOG; sets
# tracer to its PID once LOG says WORD (it is attached), and stops it when
# the (sub)shell exits, so that a tracer a failed window leaves is not left
# attached beside later measurements. Fails when CMD ends before.
start_attached() {
	local log=$1 word=$2
	shift 2
	"$@" >"$log" 2>&1 &
	tracer=$!
	trap "kill -INT $tracer 2>/dev/null" EXIT
	until grep -q "$word" "$log"; do
		kill -0 $tracer 2>/dev/null || { echo "$*: ended before attaching:" >&2; cat "$log" >&2; exit 1; }
		sleep 0.1
	done
}

# start_agent LOG GPUMEM...: start_attached for GPUMEM... (a gpumem binary,
# after a taskset where wanted) as the agent on the simulated driver with
# every process's tensor view.
start_agent() {
	local log=$1
	shift
	start_attached "$log" "attached to" "$@" agent --library "$sim/libcuda.so.1" --tensors=all --metrics-address "" --nvml-library ""
}

# run_time PID MIN: the run time per run, in ns, of the BPF programs PID
# holds that ran MIN times at least (those that ran for every pair), from
# their file descriptors' fdinfo (kernel.bpf_stats_enabled); nothing when
# none did.
run_time() {
	local f
	for f in /proc/"$1"/fdinfo/*; do
		grep -q '^prog_type' "$f" 2>/dev/null || continue
		awk '/^run_cnt/ {runs = $2} /^run_time_ns/ {ns = $2} END {print runs + 0, ns + 0}' "$f"
	done | awk -v min="$2" '$1 >= min {runs += $1; ns += $2} END {if (runs) print int(ns / runs)}'
}
