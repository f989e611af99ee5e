"""Scrapes and checks of run_leak.sh.

check_leak.py scrape URL PID
    every second, the agent's growth gauges of PID (gpumem_growing_* and
    gpumem_exhaustion_*), a JSON line each: {"t", "growing": [{"view",
    "function", "gpu", "bytes_per_second", "stacks", "seconds"}],
    "exhaustion": [{"gpu", "seconds", "share"}]}
check_leak.py check MODE LOG AGENT_STDERR INTERVAL
    loss, outputs: each view's leak named within 5 intervals of the leak's
    start; the tensor view's rate within 10% of memory_allocated()'s slope
    over the same window; each exhaustion forecast (when it was first read
    plus its seconds) within 20% of the time left to torch's out of memory;
    the record's growing stacks through the leaking function.
    steady, generate: nothing of the process growing, ever.
"""
import json
import re
import statistics
import sys
import time
import urllib.request

SAMPLE = re.compile(r'^(gpumem_growing_bytes_per_second|gpumem_growing_stacks|gpumem_growing_seconds|'
                    r'gpumem_exhaustion_seconds|gpumem_exhaustion_share)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url, pid):
    while True:
        t = time.time()
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError as e:
            print(json.dumps({"t": t, "error": str(e)}), flush=True)
            time.sleep(1)
            continue
        growing, exhaustion, shares = {}, {}, {}
        for line in text.splitlines():
            m = SAMPLE.match(line)
            if not m:
                continue
            name, labels, value = m.group(1), dict(LABEL.findall(m.group(2))), float(m.group(3))
            if name == "gpumem_exhaustion_seconds":
                exhaustion[labels["gpu"]] = value
            elif name == "gpumem_exhaustion_share":
                if labels["pid"] == pid:
                    shares[labels["gpu"]] = value
            elif labels["pid"] == pid:
                g = growing.setdefault((labels["view"], labels["gpu"]), {"view": labels["view"], "gpu": labels["gpu"],
                                                                         "function": labels["function"]})
                g[name.removeprefix("gpumem_growing_")] = value
        out = {"t": t, "growing": list(growing.values()),
               "exhaustion": [{"gpu": gpu, "seconds": s, "share": shares[gpu]} for gpu, s in exhaustion.items() if gpu in shares]}
        print(json.dumps(out), flush=True)
        time.sleep(max(0.0, t + 1 - time.time()))


def lines(path, prefix):
    with open(path) as f:
        return [json.loads(line[len(prefix):]) for line in f if line.startswith(prefix)]


def steps_of(log):
    """The workload's steps, its JSON lines."""
    return [json.loads(line) for line in open(log + ".stdout") if line.startswith("{")]


def slope(steps, start, end, key="allocated"):
    """Least squares slope of key over the steps in [start, end], bytes/s."""
    pts = [(s["t"], s[key]) for s in steps if start <= s["t"] <= end]
    if len(pts) < 2:
        return None
    mt = statistics.fmean(t for t, _ in pts)
    mv = statistics.fmean(v for _, v in pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return sum((t - mt) * (v - mv) for t, v in pts) / den if den else None


def first_seen(scrapes, pick):
    """(t, value) for each distinct value pick gives, at the scrape it first appeared."""
    out, last = [], None
    for s in scrapes:
        v = pick(s)
        if v is not None and v != last:
            out.append((s["t"], v))
        last = v
    return out


def check_leak(mode, log, interval):
    ok = True
    steps = steps_of(log)
    oom = lines(log + ".stdout", "oom ")
    if not oom:
        print(f"FAIL {mode}: torch raised no out of memory")
        return False
    t0, t_oom = steps[0]["t"], oom[0]["t"]
    scrapes = [s for s in lines(log + ".scrapes", "") if "growing" in s]
    print(f"{mode}: the leak from {t0:.1f}, out of memory {t_oom - t0:.1f} s later, after {oom[0]['step']} steps; "
          f"memory_allocated() {slope(steps, t0, t_oom) / 2**20:.1f} MiB/s, memory_reserved() {slope(steps, t0, t_oom, 'reserved') / 2**20:.1f} MiB/s")
    for view in ("tensor", "driver"):
        seen = [s for s in scrapes if any(g["view"] == view for g in s["growing"])]
        if not seen:
            print(f"FAIL {mode}: the {view} view never named it growing")
            ok = False
            continue
        within = (seen[0]["t"] - t0) / interval
        g = next(g for g in seen[0]["growing"] if g["view"] == view)
        verdict = "ok" if within <= 5 + 2 / interval else "FAIL"
        ok &= verdict == "ok"
        print(f"{verdict} {mode}, {view} view: growing {within:.2f} intervals after the leak began, under {g['function']} "
              f"({int(g['stacks'])} stacks)")
        rates = first_seen(seen, lambda s: next((g["bytes_per_second"] for g in s["growing"] if g["view"] == view), None))
        errors = []
        for t, rate in rates:
            # The agent's rate is its lows' rise over the last intervals:
            # the level at each interval's start, the last one's at t - interval.
            torch_rate = slope(steps, t - 5 * interval, t - interval)
            if torch_rate:
                errors.append(rate / torch_rate - 1)
                print(f"    at +{t - t0:.0f} s: {rate / 2**20:.1f} MiB/s, memory_allocated()'s slope {torch_rate / 2**20:.1f} MiB/s "
                      f"({100 * (rate / torch_rate - 1):+.1f}%)")
        if view == "tensor":
            med = statistics.median(errors) if errors else None
            verdict = "ok" if med is not None and abs(med) <= 0.10 else "FAIL"
            ok &= verdict == "ok"
            print(f"{verdict} {mode}, tensor view: the rate's median error {100 * med if med is not None else float('nan'):+.1f}% (10% allowed)")
    forecasts = first_seen(scrapes, lambda s: next((e["seconds"] for e in s["exhaustion"]), None))
    if not forecasts:
        print(f"FAIL {mode}: no exhaustion forecast")
        return False
    errors = []
    for t, seconds in forecasts:
        left = t_oom - t
        err = (seconds - left) / left
        print(f"    forecast at +{t - t0:.0f} s: out of memory in {seconds:.0f} s; it came {left:.0f} s later ({100 * err:+.1f}%)")
        if left >= 2 * interval:  # a forecast is of the interval's end: nearer, a second is a large share
            errors.append(err)
    worst = max(errors, key=abs) if errors else None
    verdict = "ok" if errors and abs(errors[0]) <= 0.2 and abs(worst) <= 0.2 else "FAIL"
    ok &= verdict == "ok"
    print(f"{verdict} {mode}: exhaustion forecast, the first {100 * errors[0] if errors else float('nan'):+.1f}%, "
          f"the worst {100 * worst if worst is not None else float('nan'):+.1f}% of the time left (20% allowed)")
    ok &= check_record(mode, log)
    return ok


def check_record(mode, log):
    with open(log + ".record.json") as f:
        growing = json.load(f)["growing"]
    leaking = f"leak_{mode}_step"
    ok = True
    for view in ("tensor", "driver"):
        stacks = [g for g in growing if g["view"] == view]
        through = [g for g in stacks if any(fr["function"] == leaking and fr.get("file", "").endswith("torch_leak.py") for fr in g["frames"])]
        verdict = "ok" if through else "FAIL"
        ok &= bool(through)
        print(f"{verdict} {mode}, record's {view} view: {len(stacks)} growing stacks, {len(through)} through {leaking}")
        for g in stacks[:3]:
            frames = [fr for fr in g["frames"] if fr.get("file")][:4]
            print(f"    {g['bytes_per_second'] / 2**20:.1f} MiB/s: " + " <- ".join(f"{fr['function']} ({fr['file'].rsplit('/', 1)[-1]}:{fr.get('line', 0)})" for fr in frames))
    return ok


def check_steady(mode, log, agent_stderr, interval):
    steps = steps_of(log)
    scrapes = [s for s in lines(log + ".scrapes", "") if "growing" in s]
    pid = open(log + ".stdout").readline().split()[1]
    flagged = [s for s in scrapes if s["growing"]]
    said = [line.strip() for line in open(agent_stderr) if f"growing: pid {pid} " in line]
    span = (scrapes[-1]["t"] - scrapes[0]["t"]) / interval if scrapes else 0
    print(f"{mode}: {len(steps) * 10} steps over {span:.1f} intervals, memory_allocated() "
          f"{min(s['allocated'] for s in steps) / 2**20:.0f} to {max(s['allocated'] for s in steps) / 2**20:.0f} MiB")
    if flagged or said:
        print(f"FAIL {mode}: named growing: {flagged[:3]} {said[:3]}")
        return False
    print(f"ok {mode}: nothing named growing in {len(scrapes)} scrapes")
    return True


def main():
    if sys.argv[1] == "scrape":
        scrape(sys.argv[2], sys.argv[3])
    mode, log, agent_stderr, interval = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
    ok = check_leak(mode, log, interval) if mode in ("loss", "outputs") else check_steady(mode, log, agent_stderr, interval)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
