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
