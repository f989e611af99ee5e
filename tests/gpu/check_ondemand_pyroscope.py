"""Reads back, from a real Pyroscope, the tensor series of an on-demand view
(run_ondemand_pyroscope.sh): every point of the process's series labelled
with its view's tensor_view_since, the last one 4 MiB (the late tensors).
Usage: check_ondemand_pyroscope.py URL PID SINCE"""
import sys, time, json
sys.path.insert(0, __import__("os").path.dirname(__file__))
from check_agent_pyroscope import series, points, PROFILE_TYPES
url, pid, since = sys.argv[1], sys.argv[2], sys.argv[3]
now = int(time.time() * 1000)
body, resp = series(url, '{service_name=~".+"}', now - 300000, now, group_by=("pid", "tensor_view_since"), profile_type=PROFILE_TYPES["tensor"])
pts = points(resp)
mine = [p for p in pts if p[2].get("pid") == pid]
print("tensor series labels:", sorted({json.dumps(p[2], sort_keys=True) for p in pts}))
print("last points:", [(p[0], p[1]) for p in mine[-3:]])
ok = mine and all(p[2].get("tensor_view_since") == since for p in mine) and mine[-1][1] == 4 << 20
print("RESULT", "PASS" if ok else "FAIL")
