"""Reads gpu-mem's dashboard's "held now" and "peak" flame graphs from a
real Pyroscope as Grafana asks for them (run_held_pyroscope.sh): each
panel's profile type and label selector, with every variable at All (.*),
over the panel's own window (its relative time, timeFrom, ending timeShift
before now). Over that window each reads what is held (the workload's
bytes, once); over the whole run, the intervals' profiles summed.
Usage: check_held_pyroscope.py URL DASHBOARD_JSON START_MS HELD_BYTES
"""
import json, re, sys, time
sys.path.insert(0, __import__("os").path.dirname(__file__))
from check_agent_pyroscope import post, flamegraph_functions

url, dashboard, start, held = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
UNITS = {"s": 1000, "m": 60000, "h": 3600000}


def millis(duration):
    n, unit = re.fullmatch(r"(\d+)([smh])", duration).groups()
    return int(n) * UNITS[unit]


def total(target, start_ms, end_ms):
    selector = re.sub(r"\$\{\w+:regex\}", ".*", target["labelSelector"])  # All
    fg = post(url, "SelectMergeStacktraces", {"profileTypeID": target["profileTypeId"], "labelSelector": selector,
                                              "start": start_ms, "end": end_ms})
    return flamegraph_functions(fg)[1]


ok = True
panels = json.load(open(dashboard))["panels"]
for panel in panels:
    target = panel["targets"][0]
    if panel["type"] != "flamegraph" or "tensor" in target["profileTypeId"] or "timeFrom" not in panel:
        continue
    end = int(time.time() * 1000) - millis(panel["timeShift"])
    now = total(target, end - millis(panel["timeFrom"]), end)
    run = total(target, start, end)
    print(f'{panel["title"]}: over the panel\'s window ({panel["timeFrom"]}, shifted {panel["timeShift"]}) {now},'
          f' over the run {run} ({run / held:.1f}x), held {held}')
    ok = ok and now == held and run >= 2 * held
print("RESULT", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
