"""Tensors from named functions under one of PyTorch's allocator modes
(whatever PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NO_CUDA_MEMORY_CACHING say), for
comparing gpu-mem with torch.cuda.memory_reserved()/memory_allocated().

Run it after gpumem is recording (tests/gpu/protocol.sh's record_first). It
keeps tensors from four functions; scratch allocates 256 MiB and frees it,
release_cache then empties PyTorch's cache (so a segment is given back to
the driver: cuMemFree, or cuMemUnmap+cuMemRelease with expandable segments).
Prints "t PHASE EPOCH libcuda=0|1" at its start, once torch is imported and
after load_weights (the first CUDA call: the context and the first segment).
At the known point (everything synchronized) prints "stats JSON" (torch's
counters), "done" and "expect FUNCTION=BYTES ..." (the bytes of the tensors
each function still holds), waits for a line while holding them, exits.
"""
import json
import os
import sys
import time


def stamp(phase):
    with open("/proc/self/maps") as f:
        mapped = any("libcuda.so" in line for line in f)
    print(f"t {phase} {time.time():.6f} libcuda={int(mapped)}", flush=True)


stamp("start")
import torch  # noqa: E402

stamp("imported")

MiB = 1 << 20
held = {}


def keep(name, *tensors):
    held.setdefault(name, []).extend(tensors)


def load_weights():
    for _ in range(4):
        keep("load_weights", torch.empty(50 * MiB, dtype=torch.uint8, device="cuda"))


def kv_cache():
    keep("kv_cache", torch.zeros(8, 1024, 1024, dtype=torch.float16, device="cuda"))


def activations():
    acts = [torch.empty(300_000, dtype=torch.uint8, device="cuda") for _ in range(40)]
    keep("activations", *acts[::4])


def small_buffers():
    for i in range(100):
        keep("small_buffers", torch.empty(1000 + i, dtype=torch.uint8, device="cuda"))


def scratch():
    t = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    t.fill_(1)
    torch.cuda.synchronize()
    del t


def release_cache():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def torch_stats():
    s = {"mode": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or
         ("no-caching" if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1" else "default"),
         "torch": torch.__version__}
    for name in ("memory_allocated", "memory_reserved", "max_memory_reserved"):
        try:
            s[name] = getattr(torch.cuda, name)()
        except Exception as e:  # noqa: BLE001
            s[name] = f"error: {e}"
    try:
        free, total = torch.cuda.mem_get_info()
        s["device_used"] = total - free
    except Exception as e:  # noqa: BLE001
        s["device_used"] = f"error: {e}"
    try:
        ms = torch.cuda.memory_stats()
        s["memory_stats"] = {k: v for k, v in ms.items() if ".all." in k and k.endswith(".current") or k.startswith("num_")}
    except Exception as e:  # noqa: BLE001
        s["memory_stats"] = f"error: {e}"
    try:
        s["allocator_backend"] = torch.cuda.get_allocator_backend()
    except Exception as e:  # noqa: BLE001
        s["allocator_backend"] = f"error: {e}"
    return s


def main():
    load_weights()
    stamp("load_weights")
    kv_cache()
    activations()
    small_buffers()
    scratch()
    release_cache()
    torch.cuda.synchronize()
    stats = torch_stats()
    stats["held_bytes"] = sum(t.nbytes for ts in held.values() for t in ts)
    print("stats " + json.dumps(stats), flush=True)
    print("done", flush=True)
    print("expect " + " ".join(f"{k}={sum(t.nbytes for t in v)}" for k, v in held.items()), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
