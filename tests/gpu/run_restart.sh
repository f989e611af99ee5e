#!/usr/bin/env bash
# The agent restarted twice under a transformers Llama (torch_restart.py),
# its state kept (--state-dir, --pin-path on a BPF file system of its own),
# pushing to a real Grafana Pyroscope (v1.15.0 or v2.2.1, a test peer built
# outside the repository): agent 1 sees the model built; SIGTERM; the Llama trains while
# no agent runs; agent 2 continues, its last push read from the server;
# SIGKILL; the Llama trains again; agent 3 continues, its last push read;
# then gpumem record continues the state and writes its JSON. Each time the
# bytes under LlamaForCausalLM.__init__ must be the segments PyTorch's
# allocator took while the model was built (check_restart.py), and the
# record's live bytes all of memory_reserved().
#
# Usage: PYRO=path/to/pyroscope tests/gpu/run_restart.sh GPUMEM OUTDIR
# Environment: PYTHON (python3), INTERVAL (2s), LIB (the driver library).
# Needs root and a GPU.
set -uo pipefail
gpumem=$(realpath "$1")
out=$(realpath -m "$2")
: "${PYRO:?PYRO: the pyroscope binary}"
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
interval=${INTERVAL:-2s}
secs=${interval%s}
url=http://127.0.0.1:4040
mkdir -p "$out"
export PYTHONUNBUFFERED=1
unset PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF
. "$here/protocol.sh"
. "$here/pyroscope_server.sh"

bpf=$(mktemp -d /tmp/gpumem-bpf.XXXXXX)
mount -t bpf bpf "$bpf" || { echo "FAIL: mount a BPF file system"; exit 1; }
state=$(mktemp -d /tmp/gpumem-state.XXXXXX)
data=$(mktemp -d /tmp/pyroscope-restart.XXXXXX)
pyro='' agent='' py=''
cleanup() {
	{ exec 3>&-; } 2>/dev/null
	for pid in $agent $py; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
	[ -n "$pyro" ] && kill -TERM "$pyro" 2>/dev/null && wait "$pyro" 2>/dev/null
	umount "$bpf"; rm -rf "$bpf" "$state" "$data"
}
trap cleanup EXIT
status=0
fail() { echo "FAIL: $*"; exit 1; }
check() { "$python" "$here/check_restart.py" "$@" || status=1; }

start_pyroscope "$data" "$out/pyroscope.log" || fail "pyroscope did not start"
"$python" "$here/check_agent_pyroscope.py" ready "$url" 60 || fail "pyroscope not ready"

# start_agent N: agent N on the state, pushing every $interval; returns
# once it has attached; its start in ms in $since.
start_agent() {
	since=$(($(date +%s%3N)))
	"$gpumem" agent --state-dir "$state" --pin-path "$bpf/gpu-mem" --pyroscope-url "$url" --pyroscope-interval "$interval" \
		--status-interval "$interval" --control-socket "" 2> >(stamp >"$out/agent$1.stderr") &
	agent=$!
	until grep -qs "exporting to" "$out/agent$1.stderr"; do
		kill -0 "$agent" 2>/dev/null || { cat "$out/agent$1.stderr"; fail "agent $1 ended at start"; }
		sleep 0.1
	done
	grep -h "state" "$out/agent$1.stderr"
}
# step WORD: the workload's next step, once it said WORD; its JSON in $said.
step() {
	echo >&3
	until grep -q "^$1 " "$out/workload.log"; do
		kill -0 "$py" 2>/dev/null || { cat "$out/workload.log"; fail "the workload ended"; }
		sleep 0.2
	done
	said=$(grep "^$1 " "$out/workload.log" | tail -1 | cut -d' ' -f2-)
	echo "workload: $1 $said"
}
field() { "$python" -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$said" "$1"; }

start_agent 1
fifo=$(mktemp -u) && mkfifo "$fifo"
"$python" "$here/torch_restart.py" <"$fifo" >"$out/workload.log" 2>"$out/workload.err" &
py=$!
exec 3>"$fifo"
rm -f "$fifo"
until grep -q '^ready' "$out/workload.log"; do sleep 0.1; done
step weights
pid=$(field pid) init=$(field init_reserved)
sleep $((3 * secs))
check pyroscope "$url" "$pid" "$since" "$init"

kill -TERM "$agent"; wait "$agent"; echo "agent 1 stopped (SIGTERM)"
step trained # while no agent runs
start_agent 2
sleep $((3 * secs))
check pyroscope "$url" "$pid" "$since" "$init"

kill -KILL "$agent"; wait "$agent" 2>/dev/null; echo "agent 2 killed (SIGKILL)"
step trained
reserved=$(field reserved)
start_agent 3
sleep $((3 * secs))
check pyroscope "$url" "$pid" "$since" "$init"
kill -TERM "$agent"; wait "$agent"; agent=''

"$gpumem" record --tensors=off --state-dir "$state" --pin-path "$bpf/gpu-mem" --format json -o "$out/record.json" --top 0 2>"$out/record.stderr" &
agent=$!
until grep -qs "recording" "$out/record.stderr"; do sleep 0.1; done
sleep 2
kill -INT "$agent"; wait "$agent"; agent=''
grep -h "state" "$out/record.stderr"
check record "$out/record.json" "$pid" "$init" "$reserved"
for f in "$out"/agent*.stderr; do grep status "$f" | tail -n 1; done
echo "RESULT: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
