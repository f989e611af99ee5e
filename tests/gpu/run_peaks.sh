#!/usr/bin/env bash
# Peaks on a GPU (issue 19), gpu-mem started first, as a node's agent is:
# gpumem agent (interval peaks as Prometheus gauges, scraped every 0.1 s by
# check_peaks.py scrape) and, per workload, gpumem record --format json
# (tests/gpu/protocol.sh's record_first); then
# - torch_peaks.py: a training step (forward with large activations from
#   activation_spike, backward, Adam's step) after
#   torch.cuda.reset_peak_memory_stats(), the caching allocator on;
# - jax_peaks.py with XLA_PYTHON_CLIENT_ALLOCATOR=platform: a spike of
#   arrays from activation_spike, deleted (skipped when jax is not
#   importable).
# check_peaks.py prints PASS, FAIL or SKIP per check: the tensor view's peak
# = max_memory_allocated(), the allocator's segments at the driver view's
# peak = max_memory_reserved(), XLA's buffers at the peak =
# memory_stats()["peak_bytes_in_use"], activation_spike on top of each peak
# and gone at the end, the agent's highest interval peak = record's peak.
#
# Usage: tests/gpu/run_peaks.sh GPUMEM OUTDIR
# Environment: LIB (the driver library; default: the one installed),
# WORKLOAD_ARGS (--sim: the simulated driver and allocator, with SIMCUDA_LIB
# and SIMTORCH_LIB, for a machine without a GPU; then
# LIB=build/sim/libcuda.so.1), INTERVAL (the agent's, default 1s).
# Leaves in OUTDIR: agent.stderr, agent.peaks.json, and per workload
# (torch, jax) NAME.stdout, NAME.pyerr, NAME.library.json,
# NAME.library.stderr, NAME.check. Needs root. Stops what it started, by PID.
set -uo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
interval=${INTERVAL:-1s}
unset PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF XLA_PYTHON_CLIENT_ALLOCATOR XLA_PYTHON_CLIENT_PREALLOCATE
# cuBLAS's workspace a multiple of 2 MiB (32 MiB), as every tensor of the step.
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
mkdir -p "$out"
sim=false
[[ " ${WORKLOAD_ARGS:-} " == *" --sim "* ]] && sim=true

. "$here/protocol.sh"
lib=$(driver_library) || { echo "no libcuda.so found: set LIB" >&2; exit 1; }
agent='' scraper=''
cleanup() {
	local pid
	for pid in $scraper $agent; do
		kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	done
	scraper='' agent=''
}
trap cleanup EXIT

# 1. The agent first, and its gauges scraped.
"$gpumem" agent --library "$lib" --pyroscope-interval "$interval" --status-interval "$interval" --metrics-address 127.0.0.1:0 2> >(stamp >"$out/agent.stderr") &
agent=$!
until url=$(grep -o 'http://[^ ]*/metrics' "$out/agent.stderr" 2>/dev/null); do
	kill -0 "$agent" 2>/dev/null || { echo "FAIL agent: ended at start"; cat "$out/agent.stderr"; exit 1; }
	sleep 0.1
done
python3 "$here/check_peaks.py" scrape "$url" "$out/agent.peaks.json" &
scraper=$!

# 2. The workloads, each under its own gpumem record.
status=0
echo "== PyTorch: a training step"
# shellcheck disable=SC2086
record_first "$out/torch" "$here/torch_peaks.py" ${WORKLOAD_ARGS:-} -- "library --library $lib" || status=1
tail -20 "$out/torch.pyerr"
cat "$out/torch.library.stderr"
jax=true
if ! $sim && ! python3 -c 'import jax' 2>/dev/null; then
	jax=false
fi
if $jax; then
	echo "== JAX: XLA's platform allocator"
	# shellcheck disable=SC2086
	XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false \
		record_first "$out/jax" "$here/jax_peaks.py" ${WORKLOAD_ARGS:-} -- "library --library $lib" || status=1
	grep -v '^$' "$out/jax.pyerr" | tail -20
	cat "$out/jax.library.stderr"
	grep '^stats' "$out/jax.stdout"
fi

# 3. Two intervals more, so that the last peak's gauge was shown and
# scraped; then the checks.
sleep "$(( 2 * ${interval%s} + 1 ))"
cleanup
grep 'status:' "$out/agent.stderr" | tail -3
echo "== PyTorch: the peaks against torch.cuda's"
python3 "$here/check_peaks.py" torch "$out/torch.library.json" "$out/torch.stdout" "$out/agent.peaks.json" | tee "$out/torch.check"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== JAX: the peak against memory_stats()"
if $jax; then
	python3 "$here/check_peaks.py" jax "$out/jax.library.json" "$out/jax.stdout" "$out/agent.peaks.json" | tee "$out/jax.check"
	[ "${PIPESTATUS[0]}" = 0 ] || status=1
else
	echo "SKIP jax: python3 cannot import jax" | tee "$out/jax.check"
fi
echo "RESULT $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
