#!/usr/bin/env bash
# Installs what building and testing gpu-mem needs on Debian 12 (as root):
# clang 19 and LLVM for the BPF object, a C toolchain for the simulated
# driver, allocator and workloads (sys/sdt.h for the USDT notes), Chromium for the flame graph's browser test,
# libtorch1.13 for a real large C++ library to symbolize (tests, bench), the Go
# modules, and IG's headers where its local image builder looks. Safe to run
# again.
#
# `setup.sh demo` installs only what `make demo` needs: a C compiler for the
# simulated driver and its workload (the BPF object is committed; go build
# fetches the few modules the lean build links).
set -euo pipefail

packages=(gcc make)
[ "${1:-}" = demo ] || packages+=(clang-19 llvm-19 libbpf-dev bpftool g++ util-linux chromium systemtap-sdt-dev libtorch1.13)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ "${1:-}" = demo ] && exit 0

cd "$(dirname "$0")/.."
# The fork of notation-go that IG's go.mod replaces in is not in the public
# checksum database; go.sum pins it.
GONOSUMDB=github.com/inspektor-gadget/notation-go go mod download

# IG's local image builder (gpumem image build) runs `clang -I
# /usr/include/gadget/ARCH` and `llvm-strip`: IG's BPF headers from its
# module, and Debian's versioned tools under the plain names.
ig=$(go list -m -f '{{.Dir}}' github.com/inspektor-gadget/inspektor-gadget)
if ! diff -rq "$ig/include/gadget" /usr/include/gadget >/dev/null 2>&1; then
	rm -rf /usr/include/gadget
	cp -r "$ig/include/gadget" /usr/include/gadget
	chmod -R u+w /usr/include/gadget
fi
for tool in clang llvm-strip; do
	[ "$(readlink -f "/usr/local/bin/$tool")" = "$(readlink -f "$(command -v "$tool-19")")" ] || ln -sf "$(command -v "$tool-19")" "/usr/local/bin/$tool"
done
