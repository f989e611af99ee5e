"""Under `gpumem agent --metrics-address ADDR` (started first), a PyTorch
process checks the metrics Inspektor Gadget's GPU observability dashboard
queries against its own books: for its pid, mem_alloc_bytes_total -
mem_free_bytes_total - mem_implicit_free_bytes_total on the GPU
(host_raw="0") equals the sum of its gpumem_live_bytes on GPUs, and
torch.cuda.memory_reserved() is what of it PyTorch's allocator holds; the
pinned buffer is host_raw="1". Prints RESULT PASS or FAIL.
Usage: torch_ig_metrics.py http://ADDR/metrics"""
import os, re, sys, time, urllib.request
import torch

url, pid = sys.argv[1], str(os.getpid())
weights = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
kv = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
pinned = torch.empty(32 << 20, dtype=torch.uint8).pin_memory()
torch.cuda.synchronize()
sample = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')

def scrape():
    by = {}
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        m = sample.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("pid") == pid:
            by.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return by

def active(by, host_raw):
    total = {}
    for name, sign in (("mem_alloc_bytes_total", 1), ("mem_free_bytes_total", -1), ("mem_implicit_free_bytes_total", -1)):
        for labels, v in by.get(name, []):
            if labels["host_raw"] == host_raw:
                total[name] = total.get(name, 0) + v
    return total, sum(v if n == "mem_alloc_bytes_total" else -v for n, v in total.items())

deadline = time.time() + 20
while True:
    by = scrape()
    live_gpu = sum(v for labels, v in by.get("gpumem_live_bytes", []) if labels["gpu"] not in ("host",))
    parts0, gpu = active(by, "0")
    parts1, host = active(by, "1")
    if (gpu == live_gpu and gpu >= torch.cuda.memory_reserved() and host >= pinned.numel()) or time.time() > deadline:
        break
    time.sleep(0.5)
print("host_raw 0:", parts0, "active", int(gpu), "gpumem_live_bytes on GPUs", int(live_gpu), "torch reserved", torch.cuda.memory_reserved())
print("host_raw 1:", parts1, "active", int(host), "pinned", pinned.numel())
ok = len(parts0) == 3 and gpu == live_gpu and gpu >= torch.cuda.memory_reserved() and host >= pinned.numel()
print("RESULT", "PASS" if ok else "FAIL")
