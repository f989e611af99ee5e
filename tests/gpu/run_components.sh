#!/usr/bin/env bash
# gpu-mem on real components, on one GPU, the profiler always started before
# the workload (tests/gpu/protocol.sh's record_first): JAX/XLA with the
# platform allocator (bytes per Python function, and what discovery misses
# against --library), JAX with XLA's default preallocation (who holds the
# arena), PyTorch's allocator modes (caching, expandable segments,
# cudaMallocAsync, caching off), NCCL and cuBLAS, and CUDA graphs. Each
# scenario runs under a timeout; the checks are tests/gpu/check_components.py.
# Writes every log and JSON report into OUTDIR, NAME.log per scenario, and
# prints a summary (the RESULT lines) at the end.
#
# Usage: tests/gpu/run_components.sh GPUMEM OUTDIR [SCENARIO...]
# Scenarios (default all, in this order): env jax-platform jax-arena
# torch-discovery torch-caching torch-expandable torch-async torch-nocache
# nccl graphs, and nccl-ranks (two processes, a GPU each) where two GPUs are.
# BUDGET (seconds, default 480): scenarios are skipped once it is spent;
# STEP_TIMEOUT (seconds, default 150): the limit of each scenario.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF XLA_PYTHON_CLIENT_ALLOCATOR XLA_PYTHON_CLIENT_PREALLOCATE

. "$here/protocol.sh"
lib=$(LIB= driver_library)
check() { python3 "$here/check_components.py" "$@"; }

# with_library SCRIPT CHECK: SCRIPT recorded by one gpumem on the driver
# library, then checked by check_components.py CHECK.
with_library() {
	record_first "$log" "$here/$1" -- "library --library $lib" || echo "record_first failed"
	tail -30 "$log.pyerr"
	cat "$log.library.stderr"
	check "$2" "$log.library.json" "$log.stdout"
}

scenario() {
	local name=$1 log=$2/$1
	. "$here/protocol.sh"
	[ -n "$lib" ] || [ "$name" = env ] || { echo "RESULT $name: no libcuda.so found"; return 1; }
	case $name in
	env)
		uname -a
		nvidia-smi -L
		nvidia-smi --query-gpu=memory.used,memory.total,driver_version --format=csv
		echo "driver library: $lib"
		ls -la /usr/local/nvidia/lib64/libcuda* /usr/lib/x86_64-linux-gnu/libcuda* 2>&1
		python3 -c 'import sys, torch, jax, jaxlib; print(sys.version); print("torch", torch.__version__, "jax", jax.__version__, "jaxlib", jaxlib.__version__)'
		local site f
		site=$(python3 -c 'import jax, os; print(os.path.dirname(os.path.dirname(jax.__file__)))')
		for f in $(find "$site"/jax_plugins "$site"/jax_cuda13_plugin "$site"/jaxlib -maxdepth 3 -name '*.so*' -size +1M 2>/dev/null); do
			echo "== $f $(stat -c %s "$f") bytes"
			readelf -d "$f" 2>&1 | grep -E 'NEEDED|RUNPATH|RPATH' | grep -Ei 'cuda|nccl|cublas|RPATH|RUNPATH'
		done
		"$gpumem" --help 2>&1 | head -3
		;;
	jax-platform | jax-arena)
		if [ "$name" = jax-platform ]; then
			export XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false
		fi
		record_first "$log" "$here/jax_sites.py" -- "library --library $lib" "discovery" || echo "record_first failed"
		cat "$log.pyerr" | grep -v '^$' | tail -20
		for r in library discovery; do
			echo "=== recorder $r"
			cat "$log.$r.stderr"
			if [ "$name" = jax-platform ]; then
				check jax "$log.$r.json" "$log.stdout" "$name-$r" --exact
			else
				check arena "$log.$r.json" "$log.stdout" "$name-$r"
			fi
		done
		echo "=== discovery against --library"
		check compare "$log.library.json" "$log.discovery.json" "$log.stdout" "$log.discovery.stderr" "$name-discovery"
		;;
	torch-discovery)
		record_first "$log" "$here/torch_modes.py" -- "library --library $lib" "discovery" || echo "record_first failed"
		tail -20 "$log.pyerr"
		for r in library discovery; do
			echo "=== recorder $r"
			cat "$log.$r.stderr"
			check modes "$log.$r.json" "$log.stdout" | sed "s/^RESULT default/RESULT $name-$r/"
		done
		echo "=== discovery against --library"
		check compare "$log.library.json" "$log.discovery.json" "$log.stdout" "$log.discovery.stderr" "$name"
		;;
	torch-caching | torch-expandable | torch-async | torch-nocache)
		case $name in
		torch-expandable) export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
		torch-async) export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
		torch-nocache) export PYTORCH_NO_CUDA_MEMORY_CACHING=1 ;;
		esac
		with_library torch_modes.py modes
		;;
	nccl)
		with_library torch_nccl.py nccl
		;;
	nccl-ranks)
		with_library torch_nccl_ranks.py ranks
		;;
	graphs)
		with_library torch_graphs.py graphs
		;;
	*)
		echo "unknown scenario $name"
		return 2
		;;
	esac
}

if [ "${1:-}" = --one ]; then
	gpumem=$3
	scenario "$2" "$4"
	exit
fi

gpumem=$(readlink -f "$1")
out=$2
shift 2
mkdir -p "$out"
scenarios=("$@")
if [ ${#scenarios[@]} = 0 ]; then
	scenarios=(env jax-platform jax-arena torch-discovery torch-caching torch-expandable torch-async torch-nocache nccl graphs)
	[ "$(nvidia-smi -L | wc -l)" -ge 2 ] && scenarios+=(nccl-ranks)
fi
budget=${BUDGET:-480}
start=$SECONDS
for name in "${scenarios[@]}"; do
	if [ $((SECONDS - start)) -gt "$budget" ]; then
		echo "RESULT $name: skipped (budget of ${budget}s spent)" | tee "$out/$name.log"
		continue
	fi
	t0=$SECONDS
	timeout -k 10 "${STEP_TIMEOUT:-150}" "$0" --one "$name" "$gpumem" "$out" >"$out/$name.log" 2>&1
	rc=$?
	echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$out/$name.log"
	[ $rc = 124 ] && echo "RESULT $name: TIMED OUT" >>"$out/$name.log"
done
echo
echo "== summary"
for name in "${scenarios[@]}"; do grep -h '^RESULT' "$out/$name.log" 2>/dev/null || echo "RESULT $name: (none)"; done
