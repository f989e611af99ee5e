#!/usr/bin/env bash
# Runs torch_sites.py under gpumem record, with PyTorch's caching allocator
# off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and on, and checks the bytes per site.
# Usage: tests/gpu/run_sites.sh GPUMEM OUTDIR
set -uo pipefail
gpumem=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
status=0
for caching in 0 1; do
	log=$out/sites-caching$caching
	fifo=$(mktemp -u) && mkfifo "$fifo"
	if [ "$caching" = 0 ]; then export PYTORCH_NO_CUDA_MEMORY_CACHING=1; else unset PYTORCH_NO_CUDA_MEMORY_CACHING; fi
	python3 "$here/torch_sites.py" <"$fifo" >"$log.stdout" &
	py=$!
	exec 3>"$fifo"
	until grep -q ready "$log.stdout"; do sleep 0.1; done
	"$gpumem" record --pid "$py" --format json -o "$log.json" --top 3 2>"$log.stderr" &
	rec=$!
	until grep -q "Python" "$log.stderr" && grep -q "attached" "$log.stderr"; do sleep 0.1; done
	echo >&3
	until grep -q expect "$log.stdout"; do sleep 0.1; done
	kill -INT $rec && wait $rec
	echo >&3 && exec 3>&- && wait $py
	rm -f "$fifo"
	echo "== caching=$caching"
	python3 "$here/check_sites.py" "$log.json" "$(grep expect "$log.stdout")" $caching || status=1
	cat "$log.stderr"
done
exit $status
