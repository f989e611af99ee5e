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
"$PYRO" -target=all -architecture.storage=v2 -write-path=segment-writer \
  -storage.backend=filesystem -storage.filesystem.dir=$D/local \
  -server.http-listen-address=127.0.0.1 -server.http-listen-port=4040 \
  -server.grpc-listen-address=127.0.0.1 -server.grpc-listen-port=9095 \
  -memberlist.bind-addr=127.0.0.1 -memberlist.advertise-addr=127.0.0.1 -memberlist.bind-port=7946 \
  -distributor.ring.instance-addr=127.0.0.1 -query-frontend.instance-addr=127.0.0.1 \
  -segment-writer.lifecycler.addr=127.0.0.1 -segment-writer.min-ready-duration=0s \
  -segment-writer.heartbeat-period=1s -metastore.min-ready-duration=0s \
  -metastore.address=127.0.0.1:9095 -query-backend.address=127.0.0.1:9095 \
  -metastore.data-dir=$D/metastore/data -metastore.raft.dir=$D/metastore/raft \
  -metastore.raft.snapshots-dir=$D/metastore/raft -metastore.raft.bind-address=127.0.0.1:9099 \
  -metastore.raft.advertise-address=127.0.0.1:9099 -metastore.raft.server-id=127.0.0.1:9099 \
  -compaction-worker.temp-dir=$D/tmp -embedded-grafana.data-path=$D/grafana \
  -self-profiling.disable-push=true -usage-stats.enabled=false > $D/server.log 2>&1 &
srv=$!
until curl -s 127.0.0.1:4040/ready | grep -q ready; do sleep 0.5; done
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
since=$("$gpumem" tensors list --control-socket $D/ctl.sock | awk -v p=$py '$1==p {print $3}')
"$gpumem" tensors list --control-socket $D/ctl.sock
python3 "$here/check_ondemand_pyroscope.py" http://127.0.0.1:4040 $py "$since"
echo >&3; exec 3>&-; wait $py
kill -INT $ag; wait $ag; cat $D/agent.err | tail -8
kill $srv; wait $srv 2>/dev/null
