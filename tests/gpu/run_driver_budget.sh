#!/usr/bin/env bash
# The driver view's budget on a GPU: with PyTorch's cache off, every
# torch.empty + del is a cuMemAlloc and a cuMemFree. A loop of them prints
# its time a pair each half second for 24 s; 4 s in, the agent starts with
# its defaults (--driver-budget 0.02, --driver-pair-cost 30us): it traces the
# loop's driver view, then, after its first 5 s window, switches it off, says
# why with the numbers, counts it, and counts the loop's calls since. Prints
# the loop's median time a pair with no agent, with the view on, and with it
# off (the traps alone), and RESULT PASS or FAIL.
# Usage: tests/gpu/run_driver_budget.sh GPUMEM OUTDIR.
set -uo pipefail
gpumem=$1
out=$2
mkdir -p "$out"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 -u -c '
import time, torch
torch.cuda.init()
x = torch.empty(1 << 20, device="cuda"); del x
start = time.time()
while time.time() < start + 24:
    t, n = time.perf_counter(), 0
    while time.perf_counter() < t + 0.5:
        x = torch.empty(1 << 20, device="cuda"); del x
        n += 1
    print(f"at {time.time():.3f} us_per_pair {(time.perf_counter() - t) / n * 1e6:.3f}", flush=True)
' >"$out/loop.txt" &
py=$!
sleep 4
agent_start=$(date +%s.%N)
"$gpumem" agent --metrics-address 127.0.0.1:9467 --control-socket "$out/control.sock" 2>"$out/agent.stderr" &
agent=$!
for _ in $(seq 200); do grep -q "driver view off: over budget" "$out/agent.stderr" && break; sleep 0.1; done
sleep 3
curl -s http://127.0.0.1:9467/metrics 2>/dev/null >"$out/metrics.txt" ||
	python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9467/metrics").read().decode())' >"$out/metrics.txt"
wait $py
kill -INT $agent; wait $agent
grep -E "driver view|attached" "$out/agent.stderr"
grep -E "^gpumem_driver" "$out/metrics.txt"
# The loop's time a pair: before the agent, from its attach to the switch-off
# (the metric says when), and after.
off=$(grep -E "^gpumem_driver_view_off_since_seconds\{pid=\"$py\"\}" "$out/metrics.txt" | awk '{print $2}')
python3 - "$out/loop.txt" "$agent_start" "${off:-0}" <<'PY'
import re, statistics, sys
loop = [(float(a), float(b)) for a, b in re.findall(r"at (\S+) us_per_pair (\S+)", open(sys.argv[1]).read())]
start, off = float(sys.argv[2]), float(sys.argv[3]) or float("inf")
phases = {"no agent": [u for t, u in loop if t < start],
          "driver view on": [u for t, u in loop if start + 1.5 < t < off],
          "driver view off (the traps)": [u for t, u in loop if t > off + 0.6]}
for name, xs in phases.items():
    print(f"loop, {name}: {statistics.median(xs):.2f} us a pair ({len(xs)} half-seconds)" if xs else f"loop, {name}: none")
PY
pid_calls=$(grep -E "^gpumem_driver_calls_not_traced_total\{pid=\"$py\"\}" "$out/metrics.txt" | awk '{print $2}')
exceeded=$(grep -E "^gpumem_driver_view_budget_exceeded_total " "$out/metrics.txt" | awk '{print $2}')
if grep -q "pid $py: driver view off: over budget" "$out/agent.stderr" && [ "$exceeded" = 1 ] && [ "${pid_calls:-0}" != 0 ]; then
	echo "RESULT PASS"
else
	echo "RESULT FAIL"
fi
