#!/bin/bash
# The series Inspektor Gadget's GPU observability dashboard reads
# (process_cpu:malloc:bytes::) against a real Grafana Pyroscope (v2.2.1, a
# test peer built outside the repository, shared/pyroscope-peer.md): the
# agent started first, the demo workload on the simulated driver, then the
# dashboard's query (check_malloc_pyroscope.py): the bytes each function
# allocated, summed over the intervals, are the demo's.
# Usage: PYRO=path/to/pyroscope tests/gpu/run_malloc_pyroscope.sh GPUMEM OUTDIR. Needs root.
set -u
gpumem=$(realpath "$1"); mkdir -p "$2"; D=$(mktemp -d "$(realpath "$2")/malloc.XXXX")
: "${PYRO:?PYRO: the pyroscope binary}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pyroscope_server.sh"
start_pyroscope $D $D/server.log || exit 1
srv=$pyro
cd "$here/../.."
start=$(($(date +%s) * 1000 - 60000))
"$gpumem" agent --library build/sim/libcuda.so.1 --tensors=off --pyroscope-url http://127.0.0.1:4040 --pyroscope-interval 1s --control-socket "" 2>$D/agent.err &
ag=$!
until grep -q "exporting to" $D/agent.err; do sleep 0.1; done
SIMWORK_NOWAIT=1 build/sim/simwork demo > $D/demo.out &
demo=$!
until grep -q expect $D/demo.out; do sleep 0.1; done
sleep 5
# The demo's driver allocations by function (tests/workloads/simwork.c, demo):
# 12 x 64 MiB of weights, a 512 MiB KV cache, 64 steps of 16 + 8 MiB of
# activations, a 32 MiB pinned staging buffer.
python3 "$here/check_malloc_pyroscope.py" http://127.0.0.1:4040 $start \
  '{"load_weights": 805306368, "allocate_kv_cache": 536870912, "forward_activation": 1610612736, "pin_staging_buffer": 33554432}'
status=$?
kill $demo; wait $demo 2>/dev/null
kill -INT $ag; wait $ag; tail -3 $D/agent.err
kill $srv; wait $srv 2>/dev/null
exit $status
