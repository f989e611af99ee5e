"""JAX arrays of known sizes from named functions, for validating gpu-mem
on XLA's allocator with the profiler started first.

Run it after gpumem is recording (tests/gpu/protocol.sh's record_first): it
imports jax, initializes the backend (init_backend: the CUDA plugin, the
context and, with XLA's default preallocation, the arena), then at once
creates arrays from five functions and keeps them. Prints "t PHASE EPOCH
libcuda=0|1" at each phase (whether libcuda is mapped yet), "stats JSON"
(jax.live_arrays(), the device's memory_stats(), the libcuda files mapped),
"arrays FUNCTION=NBYTES,NBYTES ..." (each live array a function made), "done"
and "expect FUNCTION=BYTES ..." (their sum), waits for a line while holding
everything, exits.

With XLA_PYTHON_CLIENT_ALLOCATOR=platform and XLA_PYTHON_CLIENT_PREALLOCATE=false
every buffer is its own driver allocation; sizes are distinct MiB multiples.
"""
import json
import os
import sys
import time

MiB = 1 << 20
held = {}  # function -> arrays it made


def libcuda_files():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libcuda.so" in line})


def stamp(phase):
    print(f"t {phase} {time.time():.6f} libcuda={int(bool(libcuda_files()))}", flush=True)


stamp("start")
import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

stamp("imported")


def keep(name, *arrays):
    held.setdefault(name, []).extend(arrays)


def init_backend():
    return jax.devices()


def load_params():
    keep("load_params", jnp.ones((3 * MiB,), jnp.float32))  # 12 MiB


def upload_table():
    keep("upload_table", jax.device_put(np.arange(10 * MiB // 4, dtype=np.int32)))  # 10 MiB, from the host


class KVCache:
    def allocate(self):
        k = jnp.zeros((7 * MiB // 2,), jnp.bfloat16)  # 7 MiB
        v = jnp.zeros((7 * MiB // 2,), jnp.bfloat16)
        keep("KVCache.allocate", k, v)


def outer():
    def inner():
        keep("outer.<locals>.inner", jnp.full((18 * MiB // 4,), 3, jnp.int32))  # 18 MiB

    inner()


@jax.jit
def layer(x, w):
    return jnp.tanh(x @ w)


def forward():
    x = jnp.ones((1024, 2048), jnp.float32)  # 8 MiB
    w = jnp.ones((2048, 1536), jnp.float32)  # 12 MiB
    keep("forward", x, w, layer(x, w))  # + 6 MiB out


def main():
    devices = init_backend()
    stamp("backend")
    load_params()
    upload_table()
    KVCache().allocate()
    outer()
    forward()
    for arrays in held.values():
        for a in arrays:
            a.block_until_ready()
    stamp("allocated")
    live = jax.live_arrays()
    try:
        mem = devices[0].memory_stats()
    except Exception as e:  # noqa: BLE001
        mem = {"error": str(e)}
    stats = {
        "jax": jax.__version__,
        "device": str(devices[0]),
        "live_arrays": len(live),
        "live_bytes": sum(a.nbytes for a in live),
        "held_bytes": sum(a.nbytes for arrays in held.values() for a in arrays),
        "memory_stats": mem,
        "libcuda": libcuda_files(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("XLA_")},
    }
    print("stats " + json.dumps(stats), flush=True)
    print("arrays " + " ".join(f"{k}={','.join(str(a.nbytes) for a in v)}" for k, v in held.items()), flush=True)
    print("done", flush=True)
    print("expect " + " ".join(f"{k}={sum(a.nbytes for a in v)}" for k, v in held.items()), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
