"""JAX arrays whose temporaries make the peak, for checking gpu-mem's peak
against XLA's own (issue 19, run_peaks.sh, check_peaks.py), with
XLA_PYTHON_CLIENT_ALLOCATOR=platform and XLA_PYTHON_CLIENT_PREALLOCATE=false:
every buffer is its own cuMemCreate, released when the array is deleted.

Usage: jax_peaks.py [--sim]
Run it after gpumem is recording (tests/gpu/protocol.sh's record_first): it
runs at once. init_backend makes the backend (jax.devices()); load_params
keeps 64 MiB; activation_spike makes four arrays of 256 MiB (ones, then
tanh, sin and a product of them: elementwise, no autotuning, no scalar on
the device) and deletes them all. Every size is a multiple of 2 MiB, the
allocation granularity, so that a buffer's driver bytes are its nbytes.

Then, holding load_params' array, prints:
  done
  expect pid=.. peak_bytes_in_use=.. bytes_in_use=.. arrays_at_peak=.. spike=..
(peak_bytes_in_use, bytes_in_use: the device's memory_stats(), -1 where it
has none; arrays_at_peak: the nbytes of the arrays alive when the last of
the spike was made; spike: activation_spike's part of them), waits for a
line, exits.

--sim makes the same buffers on the simulated driver (SIMCUDA_LIB) with
cuMemCreate and cuMemRelease through ctypes, keeping memory_stats() as
XLA does, for running this path on a machine without a GPU.
"""
import ctypes
import os
import sys

MiB = 1 << 20
GRANULE = 2 * MiB
SPIKE_ELEMENTS = 64 * MiB  # float32: 256 MiB an array


class JaxBackend:
    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        self.device = jax.devices()[0]

    def ones(self, n):
        return self.jnp.ones((n,), self.jnp.float32).block_until_ready()

    def tanh(self, x):
        return self.jnp.tanh(x).block_until_ready()

    def sin(self, x):
        return self.jnp.sin(x).block_until_ready()

    def mul(self, x, y):
        return (x * y).block_until_ready()

    def delete(self, x):
        x.delete()

    def memory_stats(self):
        try:
            return self.device.memory_stats() or {}
        except Exception:  # noqa: BLE001 (a backend without stats)
            return {}


class SimArray:
    def __init__(self, nbytes, handle):
        self.nbytes, self.handle = nbytes, handle


class SimBackend:
    """XLA's platform allocator on the simulated driver: one cuMemCreate per
    buffer on device 0, its size rounded up to the granularity."""

    class Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", ctypes.c_int * 2),
                    ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", ctypes.c_ubyte * 8)]

    def __init__(self):
        import time

        self.cuda = ctypes.CDLL(os.environ.get("SIMCUDA_LIB", "libcuda.so.1"))
        self.cuda.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_void_p, ctypes.c_ulonglong]
        self.cuda.cuMemRelease.argtypes = [ctypes.c_uint64]
        self.cuda.cuInit(0)
        self.prop = self.Prop(type=1)
        self.prop.location[0], self.prop.location[1] = 1, 0  # CU_MEM_LOCATION_TYPE_DEVICE, device 0
        self.in_use = self.peak = 0
        time.sleep(1.5)  # as jax's import takes: gpumem finds the process's Python meanwhile

    def buffer(self, n):
        nbytes = n * 4
        handle = ctypes.c_uint64()
        if self.cuda.cuMemCreate(ctypes.byref(handle), -(-nbytes // GRANULE) * GRANULE, ctypes.byref(self.prop), 0):
            raise MemoryError(nbytes)
        self.in_use += nbytes
        self.peak = max(self.peak, self.in_use)
        return SimArray(nbytes, handle.value)

    def ones(self, n):
        return self.buffer(n)

    def tanh(self, x):
        return self.buffer(x.nbytes // 4)

    sin = tanh

    def mul(self, x, y):
        return self.buffer(x.nbytes // 4)

    def delete(self, x):
        self.cuda.cuMemRelease(x.handle)
        self.in_use -= x.nbytes

    def memory_stats(self):
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.peak}


def init_backend(sim):
    return SimBackend() if sim else JaxBackend()


def load_params(b):
    return b.ones(16 * MiB)  # 64 MiB


def activation_spike(b):
    """Four 256 MiB arrays alive at once, all deleted: the spike."""
    x = b.ones(SPIKE_ELEMENTS)
    h = b.tanh(x)
    a = b.sin(h)
    y = b.mul(a, x)
    made = [x, h, a, y]
    size = sum(t.nbytes for t in made)
    for t in made:
        b.delete(t)
    return size


def main():
    b = init_backend("--sim" in sys.argv[1:])
    params = load_params(b)
    spike = activation_spike(b)
    stats = b.memory_stats()
    expect = {"pid": os.getpid(), "peak_bytes_in_use": stats.get("peak_bytes_in_use", -1),
              "bytes_in_use": stats.get("bytes_in_use", -1), "arrays_at_peak": params.nbytes + spike, "spike": spike}
    print("stats " + " ".join(f"{k}={v}" for k, v in sorted(stats.items())), flush=True)
    print("done", flush=True)
    print("expect " + " ".join(f"{k}={v}" for k, v in expect.items()), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
