#!/bin/bash
# What the series of Inspektor Gadget's GPU observability dashboard
# (process_cpu:malloc:bytes::) costs a real Grafana Pyroscope (v2.2.1 or
# v1.15.0, a test peer built outside the repository,
# shared/pyroscope-peer.md): the agent (1 s intervals) and, one after the
# other, Python processes on the simulated driver allocating from N distinct
# Python functions (simwork.py stacks: each function allocates twice, frees
# once), all within one interval; after each, the bytes and series the
# server's distributor received under the profile name process_cpu (its own
# metrics), against gpu-mem's own series (memory).
# Usage: PYRO=path/to/pyroscope tests/gpu/run_malloc_cost.sh GPUMEM OUTDIR [N...]
set -u
gpumem=$(realpath "$1"); mkdir -p "$2"; D=$(mktemp -d "$(realpath "$2")/cost.XXXX"); shift 2
: "${PYRO:?PYRO: the pyroscope binary}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pyroscope_server.sh"
start_pyroscope $D $D/server.log || exit 1
srv=$pyro
cd "$here/../.."
"$gpumem" agent --library build/sim/libcuda.so.1 --tensors=off --pyroscope-url http://127.0.0.1:4040 --pyroscope-interval 1s --status-interval 1s --control-socket "" 2>$D/agent.err &
ag=$!
until grep -q "exporting to" $D/agent.err; do sleep 0.1; done
received() { # NAME KIND: the distributor's running sum (bytes or profiles)
	curl -s 127.0.0.1:4040/metrics | awk -v t="type=\"$1\"" -v m="pyroscope_distributor_received_compressed_bytes_$2" \
		'index($0, m "{") == 1 && index($0, t) { print $2 }'
}
echo "stacks  process_cpu: series bytes (compressed)  memory: series bytes"
for n in "${@:-10 100 1000}"; do
	b0=$(received process_cpu sum); c0=$(received process_cpu count); m0=$(received memory sum); k0=$(received memory count)
	# The line after 2 s: the agent has found the interpreter by then.
	(sleep 2; echo) | SIMCUDA_LIB=build/sim/libcuda.so.1 SIMWORK_STACKS=$n python3 tests/workloads/simwork.py stacks > $D/stacks-$n.out
	sleep 4 # the interval ends and is pushed
	b1=$(received process_cpu sum); c1=$(received process_cpu count); m1=$(received memory sum); k1=$(received memory count)
	printf "%6s  %6.0f %8.0f  %6.0f %8.0f\n" $n "$(echo "${c1:-0} - ${c0:-0}" | bc)" "$(echo "${b1:-0} - ${b0:-0}" | bc)" \
		"$(echo "${k1:-0} - ${k0:-0}" | bc)" "$(echo "${m1:-0} - ${m0:-0}" | bc)"
done
kill -INT $ag; wait $ag; grep status: $D/agent.err | tail -1
kill $srv; wait $srv 2>/dev/null
