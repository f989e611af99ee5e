# Sourced by run.sh and felt.sh.
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
