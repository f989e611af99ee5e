"""What gpu-mem costs JAX with its platform allocator, measured inside one
process, under bench/gpu/model.sh (MODEL_SCRIPT=jax_cost.py), by the same
protocol as model_cost.py.

With XLA_PYTHON_CLIENT_ALLOCATOR=platform (set here), every buffer XLA makes
is its own driver allocation (cuMemCreate, cuMemRelease when deleted): the
case where the driver view sees every array, as PyTorch without its cache.
A window measures the median training step of a jitted MLP (4 layers of
2048, batch 512, SGD: its gradients and temporaries are buffers of their
own) and one jnp.ones + delete of 1 MiB (median of 5 runs of JAX_EMPTIES).
Prints "result mode=MODE step_ms=... us_op=... allocs_step=...", where
allocs_step is the buffers a step makes (XLA's own count where the device
reports one, else -1).
"""
import os
import statistics
import sys
import time

os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

STEPS = int(os.environ.get("MODEL_STEPS", 30))
EMPTIES = int(os.environ.get("JAX_EMPTIES", 1000))


def build():
    key = jax.random.PRNGKey(0)
    params = []
    for _ in range(4):
        key, sub = jax.random.split(key)
        params.append(jax.random.normal(sub, (2048, 2048), jnp.float32) * 0.02)
    x = jax.random.normal(key, (512, 2048), jnp.float32)
    return params, x


def loss(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return jnp.mean(x * x)


@jax.jit
def train_step(params, x):
    grads = jax.grad(loss)(params, x)
    return [w - 1e-3 * g for w, g in zip(params, grads)]


def step_ms(params, x):
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        params = train_step(params, x)
        jax.block_until_ready(params)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), params


def us_op(n):
    start = time.perf_counter()
    for _ in range(n):
        a = jnp.ones((1 << 18,), jnp.float32).block_until_ready()
        del a
    return (time.perf_counter() - start) / n * 1e6


def allocations():
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("num_allocs", -1)


def window(mode, params, x):
    print(f"window {mode}", flush=True)
    sys.stdin.readline()
    _, params = step_ms(params, x)  # warm-up: the agent names the stacks it sees first
    us_op(200)
    op = statistics.median(us_op(EMPTIES) for _ in range(5))
    a = allocations()
    ms, params = step_ms(params, x)
    per_step = (allocations() - a) / STEPS if a >= 0 else -1
    print(f"result mode={mode} step_ms={ms:.3f} us_op={op:.3f} allocs_step={per_step:.0f}", flush=True)
    return params


def main():
    params, x = build()
    params = train_step(params, x)
    jax.block_until_ready(params)
    if "MODEL_CPU" in os.environ:
        os.sched_setaffinity(0, {int(os.environ["MODEL_CPU"])})
    print(f"ready {os.getpid()}", flush=True)
    for mode in sys.argv[1:]:
        params = window(mode, params, x)


if __name__ == "__main__":
    main()
