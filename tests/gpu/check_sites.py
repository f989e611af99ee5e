"""Compares gpu-mem's JSON with what torch_sites.py allocated.

Usage: check_sites.py GPUMEM_JSON EXPECT_LINE CACHING(0|1)
For each site: the live device bytes of the stacks whose innermost frame
in torch_sites.py is the site's function (Model.__init__ reaches the driver
through nn.Linear.__init__, in torch's own files). Prints one line per site and exits 1 on a
mismatch: exact bytes without caching; with caching, the segment the
caching allocator asked for (the same bytes, 2 MiB for small_site).
"""
import json
import sys

report = json.load(open(sys.argv[1]))
expect = dict(kv.split("=") for kv in sys.argv[2].split()[1:])
caching = sys.argv[3] == "1"

live = {}
for stack in report["stacks"]:
    py = [f for f in stack["frames"] if f.get("file", "").endswith("torch_sites.py")]
    if stack["kind"] != "device" or not py:
        continue
    live[py[0]["function"]] = live.get(py[0]["function"], 0) + stack["live_bytes"]

ok = True
for site, nbytes in expect.items():
    want = int(nbytes)
    if caching and want < 1 << 20:
        want = 2 << 20
    got = live.get(site, 0)
    status = "ok" if got == want else "MISMATCH"
    ok = ok and got == want
    print(f"{site:24} {got:>12} bytes live, want {want:>12}  {status}")
print("python:", json.dumps(report["python"]), "losses:", json.dumps(report["losses"]))
print("example stack:", " <- ".join(f["function"] for f in report["stacks"][0]["frames"][:14]))
sys.exit(0 if ok else 1)
