"""Checks, for run_restart.sh, that the weights a Llama allocated under
LlamaForCausalLM.__init__ are charged there exactly after the agent
restarted (the driver view: the segments PyTorch's allocator took while the
model was built, torch_restart.py's init_reserved).

    check_restart.py pyroscope URL PID SINCE_MS EXPECTED
        the pid's last push since SINCE_MS in a real Grafana Pyroscope
        (memory:inuse_space), read as check_agent_pyroscope.py reads one:
        the bytes under LlamaForCausalLM.__init__ are EXPECTED.
    check_restart.py record JSON PID EXPECTED RESERVED
        gpumem record's JSON: the pid's live device bytes under
        LlamaForCausalLM.__init__ are EXPECTED, and those through PyTorch's
        caching allocator RESERVED (memory_reserved(): its segments); the
        rest (cuBLAS's handles' own workspaces) is shown by function.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from check_agent_pyroscope import PROFILE_TYPE, flamegraph_functions, match, points, post, series

INIT = "LlamaForCausalLM.__init__"


def cmd_pyroscope(url, pid, since_ms, expected):
    selector = f'{{pid="{pid}",kind="device"}}'
    _, resp = series(url, selector, since_ms, int(time.time() * 1000) + 1000)
    pts = [p for p in points(resp) if p[0] > since_ms]
    if not pts:
        print(f"FAIL: no push of {selector} since {since_ms}")
        return 1
    stamp, value = pts[-1][0], int(pts[-1][1])
    fg = post(url, "SelectMergeStacktraces", {"profileTypeID": PROFILE_TYPE, "labelSelector": selector, "start": stamp - 1000, "end": stamp})
    per_fn, total = flamegraph_functions(fg)
    got = match(per_fn, INIT)
    ok = got == expected and total == value
    print(f"{'ok' if ok else 'FAIL'}: Pyroscope, the push at {stamp}: {got} bytes under {INIT}, want {expected}; "
          f"the flame graph's total {total}, the series' {value}")
    return 0 if ok else 1


def cmd_record(path, pid, expected, reserved):
    report = json.load(open(path))
    init = allocator = 0
    others = {}
    for s in report["stacks"]:
        if s["pid"] != pid or s["kind"] != "device" or not s["live_bytes"]:
            continue
        functions = [f["function"] for f in s["frames"]]
        if any(f == INIT or f.endswith("." + INIT) for f in functions):
            init += s["live_bytes"]
        if any("CUDACachingAllocator" in f for f in functions):
            allocator += s["live_bytes"]
        else:  # the first frame past the driver's and its library's
            caller = next((f for f in functions[1:] if "+0x" not in f), functions[0])
            others[caller] = others.get(caller, 0) + s["live_bytes"]
    ok = init == expected and allocator == reserved
    print(f"{'ok' if ok else 'FAIL'}: gpumem record continuing the state: {init} bytes under {INIT}, want {expected}; "
          f"{allocator} through PyTorch's caching allocator, memory_reserved() {reserved}; beside it {others}")
    return 0 if ok else 1


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "pyroscope":
        return cmd_pyroscope(args[0], int(args[1]), int(args[2]), int(args[3]))
    if cmd == "record":
        return cmd_record(args[0], int(args[1]), int(args[2]), int(args[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
