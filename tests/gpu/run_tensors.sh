#!/usr/bin/env bash
# The tensor view on a GPU, with PyTorch's caching allocator on: gpu-mem's
# live tensor bytes per innermost frame against torch.cuda.memory._snapshot()
# (torch_tensors.py, check_tensors.py), then a deliberate out-of-memory and
# its snapshot (torch_oom.py, check_oom.py).
# Usage: tests/gpu/run_tensors.sh GPUMEM OUTDIR
set -uo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
unset PYTORCH_NO_CUDA_MEMORY_CACHING
status=0

. "$here/protocol.sh"
mkdir -p "$out/oom"

waits="PyTorch allocator probes|Python"
record_protocol "$out/tensors" "$waits" "$here/torch_tensors.py" "$out/tensors.snapshot.json"
cat "$out/tensors.stderr"
echo "== tensors against torch.cuda.memory._snapshot()"
python3 "$here/check_tensors.py" "$out/tensors.json" "$out/tensors.snapshot.json" || status=1

record_protocol "$out/oom" "$waits" "$here/torch_oom.py" -- --on-oom "$out/oom"
cat "$out/oom.stderr"
echo "== out of memory"
python3 "$here/check_oom.py" "$out/oom.json" "$(grep expect "$out/oom.stdout")" || status=1
ls -la "$out/oom"
head -5 "$out"/oom/*.folded
exit $status
