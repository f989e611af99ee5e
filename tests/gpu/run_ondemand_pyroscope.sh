#!/bin/bash
# The tensor view on demand against a real Grafana Pyroscope (v2.2.1, a test
# peer built outside the repository, shared/pyroscope-peer.md): the agent
# started first (the driver view, tensors on demand), tensor_late on the
# simulated driver and allocator, its early tensors made, then switched on with
# `gpumem tensors on`; its late tensors made; the server is asked for the
# tensor series (check_ondemand_pyroscope.py): one, labelled with the view's
# tensor_view_since, holding the late tensors alone (4 MiB).
# Usage: PYRO=path/to/pyroscope tests/gpu/run_ondemand_pyroscope.sh GPUMEM OUTDIR. Needs root.
set -u
gpumem=$(realpath "$1"); mkdir -p "$2"; D=$(mktemp -d "$(realpath "$2")/ondemand.XXXX")
: "${PYRO:?PYRO: the pyroscope binary}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pyroscope_server.sh"
start_pyroscope $D $D/server.log || exit 1
srv=$pyro
cd "$here/../.."
"$gpumem" agent --library build/sim/libcuda.so.1 --pyroscope-url http://127.0.0.1:4040 --pyroscope-interval 1s --control-socket $D/ctl.sock 2>$D/agent.err &
ag=$!
until grep -q "control socket at" $D/agent.err; do sleep 0.1; done
fifo=$D/fifo; mkfifo $fifo
SIMCUDA_LIB=build/sim/libcuda.so.1 SIMTORCH_LIB=build/sim/libc10_cuda.so /root/.pyenv/versions/3.12.1/bin/python3.12 tests/workloads/simwork.py tensor_late < $fifo > $D/py.out &
py=$!
exec 3>$fifo
until grep -q ready $D/py.out; do sleep 0.1; done
echo >&3; until grep -q early $D/py.out; do sleep 0.1; done
"$gpumem" tensors on $py --control-socket $D/ctl.sock
until grep -q "pid $py: tensor view on since" $D/agent.err; do sleep 0.1; done
echo >&3; until grep -q expect $D/py.out; do sleep 0.1; done
sleep 6
# The SINCE column, found by its header: the table gains columns (BUDGET).
since=$("$gpumem" tensors list --control-socket $D/ctl.sock | awk -v p=$py 'NR==1 {for (i = 1; i <= NF; i++) if ($i == "SINCE") c = i} $1==p {print $c}')
"$gpumem" tensors list --control-socket $D/ctl.sock
python3 "$here/check_ondemand_pyroscope.py" http://127.0.0.1:4040 $py "$since"
echo >&3; exec 3>&-; wait $py
kill -INT $ag; wait $ag; cat $D/agent.err | tail -8
kill $srv; wait $srv 2>/dev/null
