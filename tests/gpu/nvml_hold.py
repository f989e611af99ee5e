"""A GPU workload that holds its memory for tests/gpu/check_nvml.py (issue
31): nvidia-smi's per-process number against gpu-mem's parts of it.

Usage: nvml_hold.py model|jax|modules
  model    a transformers Llama built from a config (4 layers, hidden 1024,
           bf16): a training step (cuBLAS) and a Conv2d forward (cuDNN)
  jax      a jitted matmul on a 1 GiB array (XLA_PYTHON_CLIENT_PREALLOCATE=false
           is set by the checker: JAX takes what it uses, not 75% of the GPU)
  modules  torch's context, then a cubin nvcc builds here (a kernel and a
           64 MiB __device__ array) loaded with the driver's
           cuModuleLoadData from load_module, through ctypes, into torch's
           context; prints "expect pid=PID module_bytes=..." with the
           array's size
Runs at once, synchronizes, prints "done" and "expect pid=PID", holds its
memory until a line on stdin, exits. CUDA_MODULE_LOADING says how kernel
images load (torch's default: lazy).
"""
import os
import sys


def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=8000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024)
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
        conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(torch.bfloat16)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (2, 256), device="cuda")
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    image = torch.randn(8, 64, 64, 64, device="cuda", dtype=torch.bfloat16)
    held = conv(image)  # cuDNN
    torch.cuda.synchronize()
    return m, opt, held


def jax_work():
    import jax
    import jax.numpy as jnp

    x = jnp.ones((16384, 16384), dtype=jnp.float32)  # 1 GiB
    y = jax.jit(lambda a: a @ a)(x)
    y.block_until_ready()
    return x, y


MODULE_SOURCE = r"""
__device__ char big[64 << 20];
extern "C" __global__ void touch(int i) { big[i] = 1; }
"""


def build_cubin():
    import subprocess
    import tempfile

    nvcc = next((p for p in ("nvcc", "/usr/local/cuda/bin/nvcc") if subprocess.run(
        ["sh", "-c", f"command -v {p}"], capture_output=True).returncode == 0), "nvcc")
    d = tempfile.mkdtemp()
    src, cubin = os.path.join(d, "big.cu"), os.path.join(d, "big.cubin")
    with open(src, "w") as f:
        f.write(MODULE_SOURCE)
    subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-o", cubin, src], check=True)
    with open(cubin, "rb") as f:
        return f.read()


def load_module(image):
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    module = ctypes.c_void_p()
    rc = cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image))
    if rc != 0:
        raise RuntimeError(f"cuModuleLoadData: {rc}")
    return module


def modules():
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")  # torch's primary context, current on this thread
    module = load_module(build_cubin())
    torch.cuda.synchronize()
    return module


def main():
    what = sys.argv[1]
    held = {"model": model, "jax": jax_work, "modules": modules}[what]()
    print("done", flush=True)
    print(f"expect pid={os.getpid()}" + (f" module_bytes={64 << 20}" if what == "modules" else ""), flush=True)
    sys.stdin.readline()
    del held


if __name__ == "__main__":
    main()
