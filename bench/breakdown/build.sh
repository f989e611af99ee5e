#!/usr/bin/env bash
# Builds the throwaway agents that BENCHMARKS.md's breakdowns of the tensor
# view's time were measured with: the lean static gpumem of this checkout's
# HEAD with its tensor program made to return at one point (stops.patch,
# applied in a temporary worktree), one binary a point, OUTDIR/stopN. A
# point's cost is the difference of two builds' run time a run:
# bench/tensorruns/run.sh on the simulated allocator, bench/gpu/pair_cost.sh
# in torch's process on the GPU machine (bench/gpu/h200/breakdown-*.txt).
#
#   stop1  both programs return once they found their site
#   stop2  the free whole; the allocation returns after its header,
#          timestamp and arguments
#   stop3  the same after the thread's storage too
#   stop4  the allocation's Python and native capture, no record
#   stop5  the allocation whole; the free returns after its argument
#   stop6  the Python capture returns after the thread state's head,
#   stop7  after the C stack's window too,
#   stop8  after the data stack's window too
#   stop9  the Python capture whole (6-9: no native capture, no record)
#   stop10 stop9 with the stack's hash and its lookup in the thread's
#          table of stacks sent before (no native capture, no record)
#   stop11 stop9 with the walk made twice over the same frames
#   stop21 the free whole; the allocation returns at its site
#   stop22 the free returns at its site; the allocation after its header
#          and timestamp
#   stop23 the same after its arguments too
#   stop24 the tensor view without stacks: the free whole, the allocation
#          sent after its header, timestamp and arguments, no capture
#   stop25 stop24 with the three reads of user memory every Python walk
#          needs first (thread state's head, C stack's and data stack's
#          windows), no walk: exact books and the least a capture at the
#          trap reads
#
# Usage: bench/breakdown/build.sh OUTDIR [N...]   (default: every point)
set -euo pipefail
out=$(realpath -m "${1:?usage: bench/breakdown/build.sh OUTDIR [N...]}")
shift
stops=("$@")
[ ${#stops[@]} -gt 0 ] || stops=(1 2 3 4 5 6 7 8 9 10 11 21 22 23 24 25)
root=$(cd "$(dirname "$0")/../.." && pwd)
tree=$(mktemp -d)
git -C "$root" worktree add -q --detach "$tree" HEAD
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
if ! git -C "$tree" apply "$root/bench/breakdown/stops.patch"; then
	echo "build.sh: stops.patch no longer applies to program.bpf.c: move its points to the code as it is now" >&2
	exit 1
fi
mkdir -p "$out"
for stop in "${stops[@]}"; do
	echo "build.sh: stop$stop" >&2
	BPF2GO_CFLAGS=-DSTOP=$stop make -C "$tree" -s generate
	(cd "$tree" && CGO_ENABLED=0 go build -ldflags="-s -w" -tags lean -o "$out/stop$stop" ./cmd/gpumem)
done
