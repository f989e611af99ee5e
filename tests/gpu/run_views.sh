#!/usr/bin/env bash
# The driver view and the tensor view on a GPU (issue 18), with PyTorch's
# caching allocator on: gpumem records first, as a node's agent does
# (tests/gpu/protocol.sh's record_first, --format json), then
# torch_views.py runs a vLLM-shaped workload and holds its memory while
# gpumem writes its report; check_views.py compares each view with PyTorch's
# own account: the tensor view with memory_allocated() (and the requested
# bytes), the driver view under the caching allocator with
# memory_reserved(), the process's whole driver view with memory_reserved()
# plus the driver memory outside the allocator (a 6 MiB workspace from
# cuMemAlloc_v2, cuBLAS's handle) and with the device's used memory.
#
# Usage: tests/gpu/run_views.sh GPUMEM OUTDIR
# Environment: LIB (the driver library; default: the one installed),
# WORKLOAD_ARGS (--sim: the simulated driver and allocator, with SIMCUDA_LIB
# and SIMTORCH_LIB, for a machine without a GPU; then LIB=build/sim/libcuda.so.1).
# Leaves OUTDIR/views.stdout, views.pyerr, views.library.json and
# views.library.stderr. Needs root.
set -uo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
unset PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF
export PYTHONUNBUFFERED=1
mkdir -p "$out"

. "$here/protocol.sh"
lib=$(driver_library) || { echo "no libcuda.so found: set LIB" >&2; exit 1; }
status=0
# shellcheck disable=SC2086
record_first "$out/views" "$here/torch_views.py" ${WORKLOAD_ARGS:-} -- "library --library $lib" || status=1
tail -20 "$out/views.pyerr"
cat "$out/views.library.stderr"
echo "== the two views against PyTorch's own account"
python3 "$here/check_views.py" "$out/views.library.json" "$out/views.stdout" || status=1
exit $status
