"""Summarizes bench/gpu/pair_cost.sh's lines: for each depth, what the floor
and the tensor view add to a pair over the same round's none (medians over
the rounds, quartiles in brackets), and the tensor view's added cost as a
multiple of the floor's, from the medians of the added costs. Where the
lines carry each depth's run time, also the programs' run time a run at
each depth and the multiple they imply: a pair is one run of each
program, so the tensor view adds twice the difference of the two
programs' runs to the floor's added cost. On a machine whose timings move
from window to window by more than a pair costs, that multiple is the one
to read (a pair costs its loop what its programs run and its traps take).

Usage: pair_report.py LINES (pair_cost.sh's lines, or a raw file of them kept with a header)
"""
import collections
import statistics
import sys


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{q[1]:.2f} [{q[0]:.2f}-{q[2]:.2f}]"


def run_time(whole, mode, *suffixes):
    """ns a run of mode's busiest program over the rounds, from its
    bpf_runs and bpf_ns fields with these suffixes ("_d5": at depth 5;
    "": the whole window, as the older lines have it), or None."""
    runs = sum(int(r[mode].get("bpf_runs" + x, 0)) for r in whole for x in suffixes)
    ns = sum(int(r[mode].get("bpf_ns" + x, 0)) for r in whole for x in suffixes)
    return ns / runs if runs else None


def main():
    rounds = collections.defaultdict(dict)
    for line in open(sys.argv[1]):
        if " result " not in line:
            continue  # a raw file kept carries a header and this summary
        kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
        rounds[kv["round"]][kv["mode"]] = kv
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
        t, f = run_time(whole, "tensors", "_" + depth), run_time(whole, "floor", "_" + depth)
        if t is not None and f is not None:
            by_runs = 1 + 2 * (t - f) / 1000 / statistics.median(floor)
            print(f"depth {depth[1:]}: the tensor program {t:.0f} ns a run, the floor's {f:.0f}: "
                  f"{by_runs:.2f}x the floor's by the programs' run time")
    whole_window = run_time(whole, "tensors", "", "_d5", "_d40")
    if whole_window is not None:
        print(f"the tensor program: {whole_window:.0f} ns a run over the windows")


if __name__ == "__main__":
    main()
