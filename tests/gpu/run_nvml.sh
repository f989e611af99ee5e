#!/usr/bin/env bash
# Every byte nvidia-smi shows, explained per process (issue 31): gpumem
# records every process first, with NVML; then the vLLM-shaped runner, a
# transformers model (lazy and eager module loading), JAX and torch loading
# a 64 MiB module (cuModuleLoadData, eager and lazy) hold memory on
# one GPU at once, and check_nvml.py compares nvidia-smi's per-process
# numbers with gpu-mem's (PASS/FAIL lines); then nvmlcost times one read of
# the driver's NVML (the agent's cost per sample).
#
# Usage: tests/gpu/run_nvml.sh GPUMEM NVMLCOST OUTDIR [NVML_LIBRARY]
# GPUMEM: CGO_ENABLED=0 make bin/gpumem-lean; NVMLCOST: CGO_ENABLED=0 go
# build -o bin/nvmlcost ./bench/nvmlcost. Leaves OUTDIR/nvml.json and
# nvml.stderr. Needs root.
set -uo pipefail
gpumem=$1
nvmlcost=$2
out=$3
here=$(cd "$(dirname "$0")" && pwd)
status=0
python3 "$here/check_nvml.py" "$gpumem" "$out" ${4:-} || status=1
lib=$(grep -o 'NVML: driver .*(\(.*\))' "$out/nvml.stderr" | sed 's/.*(\(.*\))/\1/' | head -1)
echo "== one NVML read ($lib)"
"$nvmlcost" -library "${lib:-libnvidia-ml.so.1}" -reads 1000 || status=1
exit $status
