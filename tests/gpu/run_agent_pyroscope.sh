#!/usr/bin/env bash
# The whole path a DaemonSet node runs, against a real Grafana Pyroscope:
# starts the server (v2.2.1, a test peer built outside the repository, see
# shared/pyroscope-peer.md; single binary, v2 storage, loopback only), then
# gpumem agent pushing to it every 2 s, first and alone for a few intervals
# (no GPU process: nothing must be pushed, nothing refused), then a
# vLLM-shaped PyTorch workload (torch_agent.py) that allocates its weights
# and KV cache and holds them. Records the agent's status lines (stamped),
# its peak RSS, the time from the workload's first allocation to its first
# profile visible in Pyroscope, and queries the server
# (check_agent_pyroscope.py): the bytes under GPUModelRunner.load_model and
# _allocate_kv_cache_tensors, per kind, against the workload's own numbers.
# Beside the agent, from the start too, a gpumem record of the whole node:
# how soon after it is stopped it has written its report (the stacks named
# through a cold libtorch); and how late any status line came while the
# agent read the workload's libraries.
#
# Usage: PYRO=path/to/pyroscope tests/gpu/run_agent_pyroscope.sh GPUMEM OUTDIR
#    or: PYRO=... gpumem=bin/gpumem-lean OUT=dir tests/gpu/run_agent_pyroscope.sh
# Environment: PYTHON (python3), WORKLOAD_ARGS (--sim: the simulated driver,
# with SIMCUDA_LIB and SIMTORCH_LIB, for a machine without a GPU),
# INTERVAL (2s), IDLE_INTERVALS (3), HOLD_INTERVALS (4), PYRO_PORT (4040;
# the server also takes PYRO_PORT+5055, +3906 and +5059: 9095, 7946, 9099).
# Needs root (the agent's probes). Stops everything it started, by PID.
set -uo pipefail
gpumem=${1:-${gpumem:-}}
out=${2:-${OUT:-}}
: "${PYRO:?PYRO: the pyroscope binary}" "${gpumem:?the gpumem binary}" "${out:?the output folder}"
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
interval=${INTERVAL:-2s}
secs=${interval%s}
port=${PYRO_PORT:-4040}
grpc=$((port + 5055)) gossip=$((port + 3906)) raft=$((port + 5059))
url=http://127.0.0.1:$port
check=$here/check_agent_pyroscope.py
mkdir -p "$out"
. "$here/protocol.sh" # stamp
# PyTorch's caching allocator on, in plain segments (cuMemAlloc).
unset PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF

pyro='' agent='' py='' data='' rec=''
cleanup() {
	local pid
	{ exec 3>&-; } 2>/dev/null
	for pid in $py $agent $rec; do
		kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	done
	if [ -n "$pyro" ] && kill -TERM "$pyro" 2>/dev/null; then
		for _ in $(seq 1 100); do kill -0 "$pyro" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pyro" 2>/dev/null
		wait "$pyro" 2>/dev/null
	fi
	[ -n "$data" ] && rm -rf "$data"
	py='' agent='' pyro='' data='' rec=''
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. The server.
data=$(mktemp -d /tmp/pyroscope-agent.XXXXXX)
. "$here/pyroscope_server.sh"
start_pyroscope "$data" "$out/pyroscope.log" "$port" "$grpc" "$gossip" "$raft"
start=$EPOCHREALTIME
"$python" "$check" ready "$url" 60 || { tail -20 "$out/pyroscope.log"; fail "pyroscope not ready"; }
echo "pyroscope ready at $url in $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $start}") s (pid $pyro)"

# 2. The agent, first and alone.
"$gpumem" agent --pyroscope-url "$url" --pyroscope-interval "$interval" --status-interval "$interval" 2> >(stamp >"$out/agent.stderr") &
agent=$!
record_json=$(mktemp /tmp/gpumem-record.XXXXXX.json)
"$gpumem" record --format json -o "$record_json" --top 0 2>"$record_json.stderr" &
rec=$!
for _ in $(seq 1 300); do
	grep -q "exporting to" "$out/agent.stderr" 2>/dev/null && break
	kill -0 "$agent" 2>/dev/null || { cat "$out/agent.stderr"; fail "the agent ended at start"; }
	sleep 0.1
done
sleep "$(awk "BEGIN{print ${IDLE_INTERVALS:-3} * $secs + 0.5}")"
kill -0 "$agent" 2>/dev/null || { cat "$out/agent.stderr"; fail "the agent ended while idle"; }
grep -E 'VmRSS|VmHWM' /proc/$agent/status | tr -s ' \t' ' ' | sed 's/^/agent idle: /' | tee "$out/agent.rss"

# 3. The workload.
fifo=$(mktemp -u) && mkfifo "$fifo"
# shellcheck disable=SC2086
"$python" "$here/torch_agent.py" ${WORKLOAD_ARGS:-} <"$fifo" >"$out/workload.log" 2>&1 &
py=$!
exec 3>"$fifo"
rm -f "$fifo"
until grep -q '^ready' "$out/workload.log"; do
	kill -0 "$py" 2>/dev/null || { cat "$out/workload.log"; fail "the workload ended at start"; }
	sleep 0.1
done
# A serving engine spends seconds between loading the driver and its first
# allocation; the agent finds a new process within its scan (0.5 s). Wait
# for it (bounded) rather than race it: this pid's interpreter, allocator
# and driver (or the driver attached where it is installed, at the start).
found() {
	local log=$out/agent.stderr
	grep -q "pid $py: Python" "$log" || return 1
	grep -q "attached to /proc/$py/root/.*PyTorch allocator probes" "$log" || return 1
	grep -q "attached to /proc/$py/root/.*driver functions" "$log" ||
		grep "driver functions" "$log" | grep -qv "attached to /proc/[0-9]*/root/"
}
waited=0 t_ready=$EPOCHREALTIME
for _ in $(seq 1 300); do
	found && { waited=1; break; }
	sleep 0.1
done
echo "agent found pid $py in $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t_ready}") s"
[ $waited = 1 ] || echo "WARNING: the agent did not log this pid's interpreter, allocator and driver in 30 s; going on"
echo >&3
for _ in $(seq 1 1200); do
	grep -q '^result' "$out/workload.log" && break
	kill -0 "$py" 2>/dev/null || { cat "$out/workload.log"; fail "the workload ended before its result"; }
	sleep 0.1
done
grep -q '^result' "$out/workload.log" || fail "no result from the workload"
grep '^result' "$out/workload.log"

# 4. Its first profile in Pyroscope, then a few intervals holding.
status=0
"$python" "$check" first "$url" "$out/workload.log" 60 "$out/first.json" || status=1
sleep "$(awk "BEGIN{print ${HOLD_INTERVALS:-4} * $secs}")"

# 5. The bytes per function, as the server answers them.
"$python" "$check" check "$url" "$out/workload.log" "$out/agent.stderr" "$out" >"$out/check.txt"
[ $? = 0 ] || status=1
cat "$out/check.txt"

# 6. Stop the workload (it exits at the line), the agent, the server.
echo >&3
exec 3>&-
wait "$py" || { echo "FAIL: the workload exited $?"; status=1; }
py=''
grep -E 'VmRSS|VmHWM' /proc/$agent/status | tr -s ' \t' ' ' | sed 's/^/agent at the end: /' | tee -a "$out/agent.rss"
t_stop=$EPOCHREALTIME
kill -INT "$rec" && wait "$rec"
echo "record: exited $? and wrote its report $(awk "BEGIN{printf \"%.2f\", $EPOCHREALTIME - $t_stop}") s after being stopped;" \
	"$(grep -o '"allocated_bytes": *[0-9]*' "$record_json" | awk -F: '{n++; s+=$2} END{print n " stacks, " s " bytes allocated"}')"
rec=''
rm -f "$record_json" "$record_json.stderr"
# Status lines are due every interval: the latest against its schedule.
awk -v every="$secs" '/gpumem: status:/ { if (prev) { late = $1 - prev - every; if (late > max) max = late }; prev = $1; n++ }
	END { printf "status lines: %d, the latest %.3f s behind its interval\n", n, max }' "$out/agent.stderr"
kill -INT "$agent" && wait "$agent"
echo "agent exited $?"
agent=''
errors=$(grep -c 'level=error' "$out/pyroscope.log") # before it is stopped
cleanup
echo "== agent log"
grep -E 'gpumem: (status|attached|pid|exporting|waiting)' "$out/agent.stderr" | head -60
echo "== summary"
grep -E '^FAIL|last push|GPUModelRunner|^agent:' "$out/check.txt"
rm -f "$out/check.txt" # all in this output and check.json
echo "pyroscope: $errors error lines in its log while the agent ran"
tr '\n' ' ' <"$out/agent.rss"; echo
cat "$out/first.json" 2>/dev/null | tr -d '\n '; echo
[ $status = 0 ] && echo "agent to pyroscope: PASS" || echo "agent to pyroscope: FAIL"
exit $status
