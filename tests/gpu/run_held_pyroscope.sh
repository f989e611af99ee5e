#!/bin/bash
# gpu-mem's dashboard's held and peak flame graphs against a real Grafana
# Pyroscope (v2.2.1 or v1.15.0: a test peer built outside the repository),
# on the simulated driver: the agent at its default interval, a workload
# holding 64 MiB for five intervals, then each panel's own query
# (check_held_pyroscope.py): over the panel's window it reads the 64 MiB
# held, over the run their sum.
# Usage: PYRO=path/to/pyroscope tests/gpu/run_held_pyroscope.sh GPUMEM OUTDIR
# Needs root and make build sim.
set -u
gpumem=$(realpath "$1"); mkdir -p "$2"; D=$(mktemp -d "$(realpath "$2")/held.XXXX")
: "${PYRO:?PYRO: the pyroscope binary}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pyroscope_server.sh"
start_pyroscope $D/data $D/server.log || exit 1
srv=$pyro
cd "$here/../.."
start=$(($(date +%s) * 1000))
"$gpumem" agent --library build/sim/libcuda.so.1 --tensors=off --pyroscope-url http://127.0.0.1:4040 --control-socket "" 2>$D/agent.err &
ag=$!
until grep -qs "exporting to" $D/agent.err; do sleep 0.1; done
held=$((64 << 20))
(echo; sleep 90) | build/sim/simwork hold $held > $D/hold.out &
work=$!
sleep 80
python3 "$here/check_held_pyroscope.py" http://127.0.0.1:4040 dashboards/gpu-mem.json $start $held
status=$?
kill $work 2>/dev/null; wait $work 2>/dev/null
kill -INT $ag; wait $ag; grep -E "status:" $D/agent.err | tail -1
kill $srv; wait $srv 2>/dev/null
exit $status
