# Sourced by the tests/gpu scripts: their Python scripts' protocol (prints
# "ready PID", waits for a line, runs, prints "done" and "expect ...", waits
# for a line, exits) under gpumem record --pid. Needs $gpumem.

# record_protocol LOG WAITS SCRIPT [ARG...] [-- RECORD_FLAG...]
# Starts SCRIPT, records it once gpumem's log has every pattern of WAITS
# ("|"-separated), lets it run, stops gpumem once it says expect, then lets it
# exit. Leaves LOG.stdout, LOG.stderr and LOG.json.
record_protocol() {
	local log=$1 waits=$2 script=$3
	shift 3
	local args=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	local fifo py rec pattern patterns
	fifo=$(mktemp -u) && mkfifo "$fifo"
	python3 "$script" "${args[@]}" <"$fifo" >"$log.stdout" &
	py=$!
	exec 3>"$fifo"
	until grep -q ready "$log.stdout"; do sleep 0.1; done
	"$gpumem" record --pid "$py" --format json -o "$log.json" --top 3 "$@" 2>"$log.stderr" &
	rec=$!
	IFS='|' read -ra patterns <<<"$waits"
	for pattern in "${patterns[@]}"; do
		until grep -q "$pattern" "$log.stderr"; do sleep 0.1; done
	done
	echo >&3
	until grep -q expect "$log.stdout"; do sleep 0.1; done
	kill -INT $rec && wait $rec
	echo >&3 && exec 3>&- && wait $py
	rm -f "$fifo"
}

# stamp: copies stdin to stdout, each line prefixed with the epoch time
# (seconds, as Python's time.time() gives it).
stamp() {
	local line
	while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done
}

# record_first LOG SCRIPT [ARG...] -- RECORDER...
# The profiler first, as a node's agent is: starts one gpumem record per
# RECORDER (a string "NAME [FLAG...]", e.g. "library --library PATH" or
# "discovery"), each writing LOG.NAME.json and LOG.NAME.stderr (lines stamped
# by stamp), waits until each records, then starts SCRIPT, which runs at once
# and prints "done" and "expect ..." while holding its memory and waits for a
# line; stops the recorders then, and lets SCRIPT exit. Leaves LOG.stdout and
# LOG.pyerr; returns 1 when SCRIPT or a recorder ended early.
record_first() {
	local log=$1 script=$2
	shift 2
	local args=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	local fifo py spec name flags rec recs=() status=0
	for spec in "$@"; do
		read -r name flags <<<"$spec"
		# shellcheck disable=SC2086
		"$gpumem" record $flags --format json -o "$log.$name.json" --top 0 2> >(stamp >"$log.$name.stderr") &
		rec=$!
		recs+=("$rec")
		until grep -q recording "$log.$name.stderr" 2>/dev/null; do
			kill -0 "$rec" 2>/dev/null || { echo "record_first: gpumem $name ended at start" >&2; return 1; }
			sleep 0.1
		done
	done
	fifo=$(mktemp -u) && mkfifo "$fifo"
	python3 "$script" "${args[@]}" <"$fifo" >"$log.stdout" 2>"$log.pyerr" &
	py=$!
	exec 3>"$fifo"
	until grep -q '^expect' "$log.stdout"; do
		kill -0 "$py" 2>/dev/null || { echo "record_first: $script ended before expect" >&2; status=1; break; }
		sleep 0.1
	done
	for rec in "${recs[@]}"; do
		kill -INT "$rec" 2>/dev/null
		wait "$rec" || status=1
	done
	echo >&3
	exec 3>&-
	wait "$py" || status=1
	rm -f "$fifo"
	return $status
}

# driver_library: prints $LIB, else the driver library installed where GPU
# nodes put it (the first found); fails when there is none.
driver_library() {
	local f
	[ -n "${LIB:-}" ] && { echo "$LIB"; return 0; }
	for f in /usr/local/nvidia/lib64/libcuda.so.* /usr/lib/x86_64-linux-gnu/libcuda.so.* /usr/lib64/libcuda.so.*; do
		[ -e "$f" ] && { readlink -f "$f"; return 0; }
	done
	return 1
}
