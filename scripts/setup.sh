#!/usr/bin/env bash
# Installs what building and testing gpu-mem needs on Debian 12 (as root):
# clang 19 and LLVM for the BPF object, a C toolchain for the simulated
# driver and workloads, Chromium for the flame graph's browser test, and the
# Go modules. Safe to run again.
set -euo pipefail

packages=(clang-19 llvm-19 libbpf-dev bpftool gcc g++ make util-linux chromium)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cd "$(dirname "$0")/.."
# The fork of notation-go that IG's go.mod replaces in is not in the public
# checksum database; go.sum pins it.
GONOSUMDB=github.com/inspektor-gadget/notation-go go mod download
