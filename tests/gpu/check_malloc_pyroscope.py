"""Reads back, from a real Pyroscope, the series Inspektor Gadget's GPU
observability dashboard reads (run_malloc_pyroscope.sh): the server lists
the profile type process_cpu:malloc:bytes::, and the dashboard's own query
of it (its labelSelector with every namespace and pod: ".*") over the
whole run gives, under each function of the demo, the bytes it allocated
from the driver: each interval's allocations, summed.
Usage: check_malloc_pyroscope.py URL START_MS WANT_JSON
WANT_JSON: {"function": bytes, ...}."""
import json, sys, time
sys.path.insert(0, __import__("os").path.dirname(__file__))
from check_agent_pyroscope import post, flamegraph_functions, match

url, start, want = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
end = int(time.time() * 1000)
types = post(url, "ProfileTypes", {"start": start, "end": end})
ids = sorted(t["ID"] for t in types.get("profileTypes", []))
print("profile types:", ids)
selector = '{k8s_namespace=~".*",k8s_podName=~".*"}'  # the dashboard's, with All
fg = post(url, "SelectMergeStacktraces", {"profileTypeID": "process_cpu:malloc:bytes::", "labelSelector": selector, "start": start, "end": end})
per_function, total = flamegraph_functions(fg)
got = {f: match(per_function, f) for f in want}
print("total:", total, "by function:", got, "want:", want)
ok = "process_cpu:malloc:bytes::" in ids and got == want
print("RESULT", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
