#!/bin/bash
# The series Inspektor Gadget's GPU observability dashboard reads
# (process_cpu:malloc:bytes::) against a real Grafana Pyroscope (v2.2.1 or
# v1.15.0, the AKS guide's: a test peer built outside the repository,
# shared/pyroscope-peer.md), on the simulated driver:
# 1. the agent started first, the demo workload, then the dashboard's query
#    with All (check_malloc_pyroscope.py): the bytes each function allocated,
#    summed over the intervals, are the demo's; and what the server received
#    of each profile name (its distributor's metrics), the series' cost;
# 2. on a fresh server, the demo in two pods of a real API server
#    (TestGuideFlameGraph, built with the tag pyroscopepeer): the same query
#    with All gives twice the demo's bytes, with one pod the demo's.
# Usage: PYRO=path/to/pyroscope tests/gpu/run_malloc_pyroscope.sh GPUMEM OUTDIR
# Needs root, make build sim, and GPUMEM_K8S_BIN (scripts/k8s-binaries.sh).
set -u
gpumem=$(realpath "$1"); mkdir -p "$2"; D=$(mktemp -d "$(realpath "$2")/malloc.XXXX")
: "${PYRO:?PYRO: the pyroscope binary}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pyroscope_server.sh"
start_pyroscope $D/one $D/server.log || exit 1
srv=$pyro
cd "$here/../.."
start=$(($(date +%s) * 1000 - 60000))
"$gpumem" agent --library build/sim/libcuda.so.1 --tensors=off --pyroscope-url http://127.0.0.1:4040 --pyroscope-interval 1s --status-interval 1s --control-socket "" 2>$D/agent.err &
ag=$!
until grep -q "exporting to" $D/agent.err; do sleep 0.1; done
SIMWORK_NOWAIT=1 build/sim/simwork demo > $D/demo.out &
demo=$!
until grep -q expect $D/demo.out; do sleep 0.1; done
sleep 5
# The demo's allocations on the GPU by function (tests/workloads/simwork.c,
# demo): 12 x 64 MiB of weights, a 512 MiB KV cache, 64 steps of 16 + 8 MiB
# of activations; its 32 MiB pinned staging buffer is host memory, left out.
python3 "$here/check_malloc_pyroscope.py" http://127.0.0.1:4040 $start \
  '{"load_weights": 805306368, "allocate_kv_cache": 536870912, "forward_activation": 1610612736, "pin_staging_buffer": 0}'
status=$?
kill $demo; wait $demo 2>/dev/null
kill -INT $ag; wait $ag; tail -3 $D/agent.err
# What the server took in, by profile name (memory: gpu-mem's own series;
# process_cpu: the dashboard's), and the agent's pushes.
curl -s 127.0.0.1:4040/metrics | grep -E '^pyroscope_distributor_received_(compressed_bytes|decompressed_bytes|samples)_(sum|count)' | grep -E 'process_cpu|memory'
grep -E "status:" $D/agent.err | tail -1
kill $srv; wait $srv 2>/dev/null

start_pyroscope $D/two $D/server-two.log || exit 1
srv=$pyro
GPUMEM_PYROSCOPE_URL=http://127.0.0.1:4040 go test -tags pyroscopepeer -count=1 -v -run '^TestGuideFlameGraph$' ./tests/kubernetes/ > $D/pods.log 2>&1
pods=$?
grep -E "PASS|FAIL|flamegraph_peer_test" $D/pods.log | grep -v "^=== " | tail -8
kill $srv; wait $srv 2>/dev/null
[ $status = 0 ] && [ $pods = 0 ] && echo "RESULT PASS (both)" || echo "RESULT FAIL"
[ $status = 0 ] && [ $pods = 0 ]
