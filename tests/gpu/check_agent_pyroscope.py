"""Queries a real Grafana Pyroscope (v2.2.1) for what gpumem agent pushed,
for run_agent_pyroscope.sh. Standard library only (urllib).

    check_agent_pyroscope.py ready URL TIMEOUT
        waits until GET URL/ready answers "ready"; exits 1 at TIMEOUT seconds.
    check_agent_pyroscope.py first URL WORKLOAD_LOG TIMEOUT OUT_JSON
        polls SelectSeries of memory:inuse_space (the driver view: the
        allocator's first segment) for the workload's pid until a point
        is there; writes when, and the time since the workload's first
        allocation (first_alloc), to OUT_JSON.
    check_agent_pyroscope.py check URL WORKLOAD_LOG AGENT_LOG OUTDIR
        per kind (tensor, in memory:tensor_inuse_space; device, in
        memory:inuse_space): finds the workload's last push with
        SelectSeries (step 1 s), reads its flame graph with
        SelectMergeStacktraces over the second before that point's stamp
        (and /pyroscope/render over the same second), and compares the bytes
        under GPUModelRunner.load_model and _allocate_kv_cache_tensors with
        the workload's own: the tensors' requested bytes (kind="tensor") and
        the growth of memory_reserved() (kind="device"). Also reads the
        agent's status lines. Writes every request and answer to
        OUTDIR/queries.json, the comparison to OUTDIR/check.json; exits 1
        on any difference.

WORKLOAD_LOG is torch_agent.py's output: its "result {JSON}" line.

The query API (pkg/querier, pkg/api of the server): connect's JSON codec on
POST /querier.v1.QuerierService/<Method>, Content-Type application/json,
fields in protobuf JSON names (profileTypeID, labelSelector, start and end
in ms; int64s answer as strings). A flame graph is levels of quadruples
(x offset from the previous node's end in its level, total, self, index in
names). Queries need a time range. SelectMergeStacktraces sums every push
in its range, so one push is read over the second before its SelectSeries
stamp (points are stamped at the end of their step; steps count from the
query's start, not from whole seconds). GET /pyroscope/render?query=TYPE{...}
&from=MS&until=MS&format=json answers the same graph as flamebearer JSON.
"""
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

PROFILE_TYPE = "memory:inuse_space:bytes:space:bytes"  # operators/pyroscope/encode.go
# Each view is its own profile type (pprof.SampleTypes): the tensor view's
# series never show under memory:inuse_space.
PROFILE_TYPES = {"device": PROFILE_TYPE, "tensor": "memory:tensor_inuse_space:bytes:space:bytes"}
FUNCTIONS = ("GPUModelRunner.load_model", "GPUModelRunner._allocate_kv_cache_tensors")
# The workload's number each kind must show per function.
EXPECTED_FIELD = {"tensor": "requested", "device": "reserved"}


def post(url, method, body, timeout=30):
    req = urllib.request.Request(
        f"{url}/querier.v1.QuerierService/{method}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{method} {json.dumps(body)}: HTTP {e.code}: {e.read()[:500]!r}") from None


def get(url, path, timeout=30):
    with urllib.request.urlopen(f"{url}{path}", timeout=timeout) as r:
        return r.read()


def series(url, selector, start_ms, end_ms, group_by=(), profile_type=PROFILE_TYPE):
    body = {"profileTypeID": profile_type, "labelSelector": selector, "start": start_ms, "end": end_ms, "step": 1}
    if group_by:
        body["groupBy"] = list(group_by)
    return body, post(url, "SelectSeries", body)


def points(resp):
    """[(timestamp ms, value, labels)] of every series, by time."""
    out = []
    for s in resp.get("series", []):
        labels = {l["name"]: l["value"] for l in s.get("labels", [])}
        for p in s.get("points", []):
            out.append((int(p["timestamp"]), float(p.get("value", 0)), labels))
    return sorted(out, key=lambda p: p[0])


def function_bytes(names, levels):
    """Bytes under each function name (a node's total, not counted again
    under an ancestor of the same name) and the graph's total."""
    # Absolute x of every node, level by level; a node's parent is the node
    # of the level above whose span holds its x.
    nodes = []  # per level: [(x, total, self, name, counted)]
    for level in levels:
        values = [int(v) for v in level]
        row, x = [], 0
        for i in range(0, len(values), 4):
            off, total, self_, name = values[i : i + 4]
            x += off
            row.append((x, total, self_, names[name]))
            x += total
        nodes.append(row)
    out = {}
    # ancestors' names per node, carried down
    above = [(0, 1 << 62, frozenset())]
    for row in nodes:
        here = []
        j = 0
        for x, total, _, name in row:
            while j < len(above) and above[j][0] + above[j][1] <= x:
                j += 1
            anc = above[j][2] if j < len(above) else frozenset()
            if name not in anc:
                out[name] = out.get(name, 0) + total
            here.append((x, total, anc | {name}))
        above = here
    return out


def flamegraph_functions(resp):
    fg = resp.get("flamegraph") or {}
    levels = [l.get("values", []) for l in fg.get("levels", [])]
    return function_bytes(fg.get("names", []), levels), int(fg.get("total", 0))


def render_functions(url, query, start_ms, end_ms):
    """The same second through /pyroscope/render (flamebearer JSON)."""
    q = urllib.parse.urlencode({"query": query, "from": str(start_ms), "until": str(end_ms), "format": "json"})
    path = f"/pyroscope/render?{q}"
    body = json.loads(get(url, path))
    fb = body.get("flamebearer") or {}
    return path, body, function_bytes(fb.get("names", []), fb.get("levels", [])), int(fb.get("numTicks", 0))


def match(per_function, name):
    """Bytes of the frames named name, or whose name ends with it (a
    qualified or decorated Python name)."""
    return sum(v for k, v in per_function.items() if k == name or k.endswith("." + name) or k.endswith(" " + name))


def cmd_ready(url, timeout):
    deadline = time.time() + float(timeout)
    while time.time() < deadline:
        try:
            if get(url, "/ready", timeout=2).decode().strip() == "ready":
                return 0
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    print(f"{url}/ready: not ready after {timeout} s", file=sys.stderr)
    return 1


def workload_result(path):
    for line in open(path, errors="replace"):
        if line.startswith("result "):
            return json.loads(line[len("result "):])
    raise SystemExit(f"{path}: no result line")


def cmd_first(url, result_path, timeout, out_path):
    result = workload_result(result_path)
    t0 = result["first_alloc"]
    selector = f'{{pid="{result["pid"]}"}}'
    deadline = time.time() + float(timeout)
    tries = 0
    while time.time() < deadline:
        tries += 1
        now = time.time()
        try:
            _, resp = series(url, selector, int(t0 * 1000) - 2000, int(now * 1000) + 1000, group_by=("kind",))
        except (OSError, RuntimeError) as e:
            resp, err = {}, str(e)
        pts = points(resp)
        if pts:
            seen = time.time()
            out = {
                "selector": selector,
                "visible_at": seen,
                "latency_s": round(seen - t0, 3),
                "first_point_ms": pts[0][0],
                "first_point_after_first_alloc_s": round(pts[0][0] / 1000 - t0, 3),
                "kinds": sorted({p[2].get("kind", "") for p in pts}),
                "queries": tries,
            }
            json.dump(out, open(out_path, "w"), indent=1)
            print(f"first profile of pid {result['pid']} visible {out['latency_s']} s after its first allocation "
                  f"(point stamped {out['first_point_after_first_alloc_s']} s after it; kinds {out['kinds']}; {tries} queries)")
            return 0
        time.sleep(0.25)
    json.dump({"selector": selector, "visible_at": None, "queries": tries}, open(out_path, "w"))
    print(f"no profile of pid {result['pid']} in {timeout} s ({tries} queries)", file=sys.stderr)
    return 1


STATUS = re.compile(r"^(\S+) gpumem: status: (\d+) processes, (\d+) events, (\d+) losses, (\d+) unknown frees(.*)$")
PUSH = {k: re.compile(r"(\d+) " + k) for k in ("done", "failed", "rejected", "dropped", "queued", "expired")}


def agent_status(log_path, ready_time):
    """The agent's status lines: all, and those before the workload (idle)."""
    lines = []
    for raw in open(log_path, errors="replace"):
        m = STATUS.match(raw.rstrip("\n"))
        if not m:
            continue
        g = m.groups()
        line = {"time": float(g[0]), "processes": int(g[1]), "events": int(g[2]), "losses": int(g[3]),
                "unknown_frees": int(g[4]), "rest": g[5]}
        pushes = g[5].split(", last error:")[0].split(", last rejection:")[0]
        for k, r in PUSH.items():
            p = r.search(pushes)
            line[k] = int(p.group(1)) if p else 0
        lines.append(line)
    idle = [l for l in lines if l["time"] < ready_time]
    return lines, idle


def cmd_check(url, result_path, agent_log, outdir):
    result = workload_result(result_path)
    queries = {}
    service = result["comm"]
    t0 = result["first_alloc"]
    now = time.time()
    status = 0
    report = {"workload": result, "kinds": {}}

    lines, idle = agent_status(agent_log, float(result.get("ready_time", t0)))
    report["agent"] = {"status_lines": len(lines), "idle_status_lines": len(idle),
                       "last": lines[-1] if lines else None, "idle_last": idle[-1] if idle else None}
    print(f"agent: {len(lines)} status lines, {len(idle)} before the workload started")
    for l in idle:
        print(f"  idle  {l['time']:.3f} processes={l['processes']}{l['rest']}")
    if any(l["failed"] or l["rejected"] for l in idle):
        print("FAIL: before the workload a push failed or was refused (with no GPU process: an interval without "
              "series, which the server refuses)")
        status = 1
    if any(l["processes"] for l in idle):
        print("note: other GPU processes ran on this node before the workload")
    if lines:
        last = lines[-1]
        print(f"  last  {last['time']:.3f} processes={last['processes']} events={last['events']} losses={last['losses']}"
              f"{last['rest']}")
        if last["done"] == 0 or any(last[k] for k in ("failed", "rejected", "dropped", "expired", "losses")):
            print("FAIL: the agent's pushes did not all go through (see its status lines)")
            status = 1
    else:
        print("FAIL: no status line from the agent")
        status = 1

    # What the server knows of the workload.
    for name, method, body in (
        ("profile_types", "ProfileTypes", {"start": int(t0 * 1000) - 60000, "end": int(now * 1000) + 1000}),
        ("series_labels", "Series", {"matchers": [f'{{service_name="{service}"}}'],
                                      "start": int(t0 * 1000) - 60000, "end": int(now * 1000) + 1000}),
    ):
        try:
            resp = post(url, method, body)
        except RuntimeError as e:
            resp = {"error": str(e)}
        queries[name] = {"request": {"method": method, "body": body}, "response": resp}
    types = [t.get("ID") for t in queries["profile_types"]["response"].get("profileTypes", [])]
    print(f"profile types: {types}")
    for pt in PROFILE_TYPES.values():
        if pt not in types:
            print(f"FAIL: {pt} is not among the server's profile types")
            status = 1

    for kind, field in EXPECTED_FIELD.items():
        # pid too: the node may run other processes of the same name
        selector = f'{{service_name="{service}",kind="{kind}",pid="{result["pid"]}"}}'
        body, resp = series(url, selector, int(t0 * 1000) - 2000, int(now * 1000) + 1000, profile_type=PROFILE_TYPES[kind])
        queries[f"series.{kind}"] = {"request": {"method": "SelectSeries", "body": body}, "response": resp}
        pts = points(resp)
        k = report["kinds"][kind] = {"selector": selector, "points": [(p[0], p[1]) for p in pts]}
        print(f"== kind={kind}: SelectSeries {selector} step 1 s: {len(pts)} points")
        for p in pts:
            print(f"   {p[0]} ({p[0] / 1000 - t0:+.3f} s from the first allocation) {int(p[1])}")
        if not pts:
            print(f"FAIL: no series {selector}")
            status = 1
            continue
        stamp, value = pts[-1][0], int(pts[-1][1])  # the last push: every tensor held
        merge = {"profileTypeID": PROFILE_TYPES[kind], "labelSelector": selector, "start": stamp - 1000, "end": stamp}
        fg = post(url, "SelectMergeStacktraces", merge)
        queries[f"flamegraph.{kind}"] = {"request": {"method": "SelectMergeStacktraces", "body": merge}, "response": fg}
        per_fn, total = flamegraph_functions(fg)
        k.update(stamp=stamp, series_value=value, flamegraph_total=total, functions=per_fn)
        try:
            path, body_r, per_fn_r, total_r = render_functions(url, PROFILE_TYPES[kind] + selector, stamp - 1000, stamp)
            queries[f"render.{kind}"] = {"request": {"get": path}, "response": body_r}
        except (OSError, ValueError, urllib.error.URLError) as e:
            per_fn_r, total_r = {}, None
            print(f"   /pyroscope/render: {e}")
        k.update(render_total=total_r)
        print(f"   last push: stamp {stamp}, SelectSeries {value} bytes; SelectMergeStacktraces [{stamp - 1000}, {stamp}] "
              f"total {total}; /pyroscope/render total {total_r}")
        if total != value:
            print(f"FAIL: the flame graph's total {total} is not the series' point {value}")
            status = 1
        whole = result["memory_allocated"] if kind == "tensor" else result["memory_reserved"]
        print(f"   {'function':45} {'pyroscope':>12} {'render':>12} {'workload ' + field:>18}")
        expected_sum = 0
        for fn in FUNCTIONS:
            got, got_r = match(per_fn, fn), match(per_fn_r, fn)
            want = result["functions"][fn][field]
            expected_sum += want
            ok = got == want and (total_r is None or got_r == want)
            print(f"   {fn:45} {got:>12} {got_r:>12} {want:>18} {'ok' if ok else 'DIFFERS'}")
            k.setdefault("compare", {})[fn] = {"pyroscope": got, "render": got_r, "workload": want}
            if not ok:
                status = 1
        print(f"   total {total} against the workload's {('memory_allocated' if kind == 'tensor' else 'memory_reserved')} {whole}"
              f" and its two functions' {expected_sum}")
        if total != expected_sum:
            print(f"   (the graph holds {total - expected_sum} bytes outside the two functions)")
    json.dump(queries, open(os.path.join(outdir, "queries.json"), "w"), indent=1)
    json.dump(report, open(os.path.join(outdir, "check.json"), "w"), indent=1)
    print("PASS" if status == 0 else "FAIL")
    return status


def main():
    cmds = {"ready": (cmd_ready, 2), "first": (cmd_first, 4), "check": (cmd_check, 4)}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds or len(sys.argv) != 2 + cmds[sys.argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    return cmds[sys.argv[1]][0](*sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
