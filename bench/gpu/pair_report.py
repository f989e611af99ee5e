"""Summarizes bench/gpu/pair_cost.sh's lines: for each depth, what the floor
and the tensor view add to a pair over the same round's none (medians over
the rounds, quartiles in brackets), and the tensor view's added cost as a
multiple of the floor's, from the medians of the added costs.

Usage: pair_report.py LINES (pair_cost.sh's lines, or a raw file in h200/)
"""
import collections
import statistics
import sys


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{q[1]:.2f} [{q[0]:.2f}-{q[2]:.2f}]"


def main():
    rounds = collections.defaultdict(dict)
    runs = ns = 0
    for line in open(sys.argv[1]):
        if " result " not in line:
            continue  # the raw files kept in h200/ carry a header and this summary
        kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
        rounds[kv["round"]][kv["mode"]] = kv
        runs += int(kv.get("bpf_runs", 0))
        ns += int(kv.get("bpf_ns", 0))
    whole = [r for r in rounds.values() if {"none", "floor", "tensors"} <= r.keys()]
    print(f"{len(whole)} rounds; us a pair added over the same round's none, median [quartiles]:")
    for depth in ("d5", "d40"):
        key = "us_" + depth
        none = [float(r["none"][key]) for r in whole]
        floor = [float(r["floor"][key]) - float(r["none"][key]) for r in whole]
        tensors = [float(r["tensors"][key]) - float(r["none"][key]) for r in whole]
        ratio = statistics.median(tensors) / statistics.median(floor)
        print(f"depth {depth[1:]}: none {quartiles(none)} us; floor +{quartiles(floor)}; "
              f"tensor view +{quartiles(tensors)}: {ratio:.2f}x the floor's")
    if runs:
        print(f"the tensor program: {ns / runs:.0f} ns a run over {runs} runs")


if __name__ == "__main__":
    main()
