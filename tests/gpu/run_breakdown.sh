#!/usr/bin/env bash
# The breakdown and the out-of-memory verdicts on a GPU, against PyTorch's
# own account: for each mode of torch_breakdown.py (a Llama trained with
# AdamW, generating with a static cache, compiled with reduce-overhead; a
# vLLM-shaped runner; an out-of-memory of demand, one of fragmentation, one of
# set_per_process_memory_fraction),
# gpumem record (--tensors, the shipped rules) records first, as a node's
# agent does, and check_breakdown.py compares its JSON with what PyTorch
# and NVML say.
#
# Usage: tests/gpu/run_breakdown.sh GPUMEM OUTDIR [MODE...]
# Environment: LIB (the driver library; default: the one installed).
# Leaves OUTDIR/MODE.stdout, .pyerr, .library.json, .library.stderr.
# Needs root and a GPU.
set -uo pipefail
gpumem=$1
out=$2
shift 2
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(train generate compile vllm oom_demand oom_fragment oom_limit)
here=$(cd "$(dirname "$0")" && pwd)
unset PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF
export PYTHONUNBUFFERED=1
mkdir -p "$out"

. "$here/protocol.sh"
lib=$(driver_library) || { echo "no libcuda.so found: set LIB" >&2; exit 1; }
status=0
for mode in "${modes[@]}"; do
	echo "== $mode"
	record_first "$out/$mode" "$here/torch_breakdown.py" "$mode" -- "library --library $lib --tensors" || status=1
	tail -5 "$out/$mode.pyerr"
	grep -E "out of memory|error" "$out/$mode.library.stderr" | head -5
	python3 "$here/check_breakdown.py" "$out/$mode.library.json" "$out/$mode.stdout" || status=1
done
echo "RESULT: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
