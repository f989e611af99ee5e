#!/usr/bin/env bash
# Runs torch_sites.py under gpumem record, with PyTorch's caching allocator
# off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and on, and checks the bytes per site.
# Usage: tests/gpu/run_sites.sh GPUMEM OUTDIR
set -uo pipefail
gpumem=$1
out=$2
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/protocol.sh"
status=0
for caching in 0 1; do
	log=$out/sites-caching$caching
	if [ "$caching" = 0 ]; then export PYTORCH_NO_CUDA_MEMORY_CACHING=1; else unset PYTORCH_NO_CUDA_MEMORY_CACHING; fi
	record_protocol "$log" "Python|attached" "$here/torch_sites.py"
	echo "== caching=$caching"
	python3 "$here/check_sites.py" "$log.json" "$(grep expect "$log.stdout")" $caching || status=1
	cat "$log.stderr"
done
exit $status
