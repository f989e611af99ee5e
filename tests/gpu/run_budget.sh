#!/usr/bin/env bash
# The tensor view's budget on a GPU: a loop of torch.empty + del as fast as
# it goes (a few hundred thousand tensors a second) with its tensor view
# switched on (--tensor-pid) and the default budget: the agent switches the
# view off after its first window, says why with the numbers, and counts it.
# Usage: tests/gpu/run_budget.sh GPUMEM OUTDIR. Prints RESULT PASS or FAIL.
set -uo pipefail
gpumem=$1
out=$2
mkdir -p "$out"
python3 -c '
import time, torch
torch.cuda.init()
end = time.time() + 20
while time.time() < end:
    x = torch.empty(1 << 20, device="cuda"); del x
' &
py=$!
sleep 3
"$gpumem" agent --tensor-pid "$py" --metrics-address 127.0.0.1:9466 --control-socket "$out/control.sock" 2>"$out/budget.stderr" &
agent=$!
for _ in $(seq 150); do grep -q "tensor view off: over budget" "$out/budget.stderr" && break; sleep 0.1; done
sleep 0.5
exceeded=$(python3 -c 'import urllib.request; print(next(l.split()[1] for l in urllib.request.urlopen("http://127.0.0.1:9466/metrics").read().decode().splitlines() if l.startswith("gpumem_tensor_view_budget_exceeded_total")))')
kill -INT $agent; wait $agent; kill $py 2>/dev/null; wait $py 2>/dev/null
grep "tensor view" "$out/budget.stderr"
echo "gpumem_tensor_view_budget_exceeded_total $exceeded"
if grep -q "tensor view off: over budget" "$out/budget.stderr" && [ "$exceeded" = 1 ]; then echo "RESULT PASS"; else echo "RESULT FAIL"; fi
