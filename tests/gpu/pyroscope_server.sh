# Sourced by the scripts that check against a real Grafana Pyroscope (v2.2.1
# or v1.15.0, test peers built outside the repository,
# shared/pyroscope-peer.md).
# start_pyroscope DIR LOG [HTTP GRPC GOSSIP RAFT]: the server $PYRO, all in
# one process, its data under DIR, on 127.0.0.1 (ports 4040 9095 7946 9099 by
# default); its pid in $pyro. A v2 server (it has a segment writer) runs on
# v2 storage, a v1 server on v1 storage. Returns once it answers ready, or
# fails after 60 s with its log's end.
start_pyroscope() {
	local data=$1 log=$2 http=${3:-4040} grpc=${4:-9095} gossip=${5:-7946} raft=${6:-9099}
	local storage
	if "$PYRO" -help-all 2>&1 | grep -q -- -segment-writer; then
		storage="-architecture.storage=v2 -write-path=segment-writer
		-segment-writer.lifecycler.addr=127.0.0.1 -segment-writer.min-ready-duration=0s
		-segment-writer.heartbeat-period=1s -metastore.min-ready-duration=0s
		-metastore.address=127.0.0.1:$grpc -query-backend.address=127.0.0.1:$grpc
		-metastore.data-dir=$data/metastore/data -metastore.raft.dir=$data/metastore/raft
		-metastore.raft.snapshots-dir=$data/metastore/raft -metastore.raft.bind-address=127.0.0.1:$raft
		-metastore.raft.advertise-address=127.0.0.1:$raft -metastore.raft.server-id=127.0.0.1:$raft
		-compaction-worker.temp-dir=$data/tmp"
	else
		storage="-pyroscopedb.data-path=$data/v1 -compactor.data-dir=$data/compactor
		-blocks-storage.bucket-store.sync-dir=$data/sync
		-ingester.min-ready-duration=0s -ingester.heartbeat-period=1s -ingester.lifecycler.addr=127.0.0.1
		-query-scheduler.ring.instance-addr=127.0.0.1 -compactor.ring.instance-addr=127.0.0.1
		-store-gateway.sharding-ring.instance-addr=127.0.0.1 -overrides-exporter.ring.instance-addr=127.0.0.1"
	fi
	# $storage is split on purpose: one flag a word (DIR has no spaces).
	# shellcheck disable=SC2086
	"$PYRO" -target=all $storage \
		-storage.backend=filesystem -storage.filesystem.dir="$data/local" \
		-server.http-listen-address=127.0.0.1 -server.http-listen-port="$http" \
		-server.grpc-listen-address=127.0.0.1 -server.grpc-listen-port="$grpc" \
		-memberlist.bind-addr=127.0.0.1 -memberlist.advertise-addr=127.0.0.1 -memberlist.bind-port="$gossip" \
		-distributor.ring.instance-addr=127.0.0.1 -query-frontend.instance-addr=127.0.0.1 \
		-embedded-grafana.data-path="$data/grafana" \
		-self-profiling.disable-push=true -usage-stats.enabled=false >"$log" 2>&1 &
	pyro=$!
	for _ in $(seq 600); do
		curl -s "127.0.0.1:$http/ready" | grep -q ready && return 0
		kill -0 $pyro 2>/dev/null || break
		sleep 0.1
	done
	tail -20 "$log"
	echo "pyroscope not ready (ended, or 60 s passed)" >&2
	return 1
}
