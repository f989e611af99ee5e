#!/usr/bin/env bash
# Builds the kube-apiserver and etcd the Kubernetes tests run (real ones, on
# loopback), from Go modules, once per version, outside the repository:
# about 15 minutes on 2 cores the first time. Prints the directory.
set -euo pipefail
k8s=v1.36.2 staging=v0.36.2 etcd=v3.6.5
dir=${GPUMEM_K8S_CACHE:-$HOME/.cache/gpu-mem/k8s-$k8s}
mkdir -p "$dir"
export GONOSUMDB=github.com/inspektor-gadget/notation-go GOFLAGS=-mod=mod
if [ ! -x "$dir/kube-apiserver" ]; then
	b=$(mktemp -d)
	printf 'module k8sbuild\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n' "$k8s" >"$b/go.mod"
	(cd "$b" && go mod download k8s.io/kubernetes@$k8s)
	mod=$(go env GOMODCACHE)/k8s.io/kubernetes@$k8s
	# kubernetes points its staging modules at ./staging; take the published ones.
	for m in $(grep -E '=> ./staging' "$mod/go.mod" | awk '{print $1}'); do
		echo "replace $m => $m $staging" >>"$b/go.mod"
	done
	echo "k8s-binaries: building kube-apiserver $k8s" >&2
	(cd "$b" && go build -o "$dir/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
	rm -rf "$b"
fi
if [ ! -x "$dir/etcd" ]; then
	b=$(mktemp -d)
	printf 'module etcdbuild\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$etcd" >"$b/go.mod"
	echo "k8s-binaries: building etcd $etcd" >&2
	(cd "$b" && go build -o "$dir/etcd" go.etcd.io/etcd/server/v3)
	rm -rf "$b"
fi
echo "$dir"
