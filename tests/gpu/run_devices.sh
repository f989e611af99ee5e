#!/usr/bin/env bash
# (Also records the driver's description of the GPUs: gpuinfo/testdata.)
# Runs torch_devices.py on a two-GPU machine under gpumem three ways and checks
# the bytes per GPU: started by gpumem (contexts seen from their creation),
# with and without PyTorch's caching allocator; then attached to a running
# process whose contexts already exist.
# Usage: tests/gpu/run_devices.sh GPUMEM OUTDIR
set -uo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
lib=$(ls /usr/local/nvidia/lib64/libcuda.so.* /usr/lib/x86_64-linux-gnu/libcuda.so.* 2>/dev/null | head -1)
status=0
for f in /proc/driver/nvidia/gpus/*/information; do echo "== $f"; cat "$f"; done >"$out/nvidia-information.txt"
for caching in 0 1; do
	log=$out/devices-caching$caching
	if [ "$caching" = 0 ]; then export PYTORCH_NO_CUDA_MEMORY_CACHING=1; else unset PYTORCH_NO_CUDA_MEMORY_CACHING; fi
	"$gpumem" record --library "$lib" --format json -o "$log.json" --top 0 -- python3 "$here/torch_devices.py" >"$log.stdout" 2>"$log.stderr"
	echo "== started by gpumem, caching=$caching"
	python3 "$here/check_devices.py" "$log.json" "$(grep expect "$log.stdout")" "$(grep uuid "$log.stdout")" || status=1
done
unset PYTORCH_NO_CUDA_MEMORY_CACHING
. "$here/protocol.sh"
log=$out/devices-attached
WAIT=1 record_protocol "$log" "attached" "$here/torch_devices.py" -- --top 0
echo "== attached to a running process (caching on)"
python3 "$here/check_devices.py" "$log.json" "$(grep expect "$log.stdout")" || echo "(contexts made before gpumem attached: see docs/validation.md)"
exit $status
