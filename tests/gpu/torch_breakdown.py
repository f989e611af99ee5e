"""Workloads for checking gpu-mem's breakdown against PyTorch's own
account on a GPU (run_breakdown.sh, check_breakdown.py), models built
from a config, nothing downloaded.

Usage: torch_breakdown.py MODE
  train     a transformers Llama trained one step with AdamW, gradients kept
  generate  the Llama generating with a StaticCache kept
  compile   torch.compile(mode="reduce-overhead") of the Llama's forward:
            its CUDA graphs' private pools
  vllm      a vLLM-shaped runner (vllm/gpu_model_runner.py): weights, KV cache
  oom_demand       asks more than the GPU has left: torch's out-of-memory
  oom_fragment     the cache holds more free bytes than asked, in no block
                   large enough: torch's out-of-memory of fragmentation
  oom_limit        set_per_process_memory_fraction(0.05), 1 GiB held, 8 GiB
                   asked: torch refuses without asking the driver

Run after gpumem is recording (protocol.sh's record_first). It runs at
once, then, everything synchronized and held, prints "done" and
"expect {JSON}" (PyTorch's own numbers, NVML's for this process) and
waits for a line.
"""
import gc
import json
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None and t.is_cuda)


def llama(layers=4, hidden=1024):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
    with torch.device("cuda"):
        return LlamaForCausalLM(config)


def build_model():
    return llama()


def train(expect):
    model = build_model()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 32000, (4, 256), device="cuda")
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    del out, ids
    expect["parameters"] = nbytes(list(model.parameters()) + list(model.buffers()))
    expect["gradients"] = nbytes(p.grad for p in model.parameters())
    expect["optimizer_state"] = nbytes(t for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    return model, opt


def generate(expect):
    from transformers import StaticCache
    model = build_model()
    model.eval()
    cache = StaticCache(config=model.config, max_cache_len=512)
    ids = torch.randint(0, 32000, (1, 32), device="cuda")
    with torch.no_grad():
        model.generate(ids, past_key_values=cache, max_new_tokens=16, do_sample=False)
    expect["parameters"] = nbytes(list(model.parameters()) + list(model.buffers()))
    # every tensor the cache's layers hold: keys, values and their own
    # bookkeeping (a few bytes a layer), all made by transformers' cache
    expect["kv_cache"] = nbytes(t for layer in cache.layers for t in vars(layer).values() if torch.is_tensor(t))
    return model, cache


def compiled(expect):
    model = build_model()
    model.eval()
    step = torch.compile(model, mode="reduce-overhead")
    ids = torch.randint(0, 32000, (1, 64), device="cuda")
    with torch.no_grad():
        for _ in range(3):
            out = step(input_ids=ids).logits.clone()
    torch.cuda.synchronize()
    expect["cuda_graph_pools"], _ = graph_pools()
    return model, step, out


def vllm(expect):
    sys.path.insert(0, HERE)
    from vllm.gpu_model_runner import GPUModelRunner
    runner = GPUModelRunner(layers=8, hidden=2048, blocks=256, block_size=16)
    runner.load_model()
    runner.initialize_kv_cache()
    out = runner.execute_model(64)
    expect["parameters"] = nbytes(runner.weights)
    expect["kv_cache"] = nbytes(runner.kv_caches)
    return runner, out


def asked_and_cache(err):
    """What torch's out-of-memory message says: asked, and reserved but unallocated."""
    units = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": MiB, "GiB": 1 << 30}
    m = re.search(r"Tried to allocate ([\d.]+) (\w+)", str(err))
    c = re.search(r"([\d.]+) (\w+) is reserved by PyTorch but unallocated", str(err))
    return (round(float(m.group(1)) * units[m.group(2)]) if m else -1,
            round(float(c.group(1)) * units[c.group(2)]) if c else -1)


def ask_too_much(n, expect):
    """Asks for n bytes, which torch refuses: its message said in expect."""
    try:
        torch.empty(n, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as err:
        expect["oom_message"] = str(err).splitlines()[0]
        expect["asked"], expect["reserved_unallocated"] = asked_and_cache(err)


def oom_demand(expect):
    free, _ = torch.cuda.mem_get_info()
    held = torch.empty(free - 4096 * MiB, dtype=torch.uint8, device="cuda")
    ask_too_much(8192 * MiB, expect)
    return held


def oom_fragment(expect):
    """One segment over all but 1 GiB of the GPU, cached, then split into
    256 MiB blocks of which every other one is freed: half the segment is
    free, in no block larger than 256 MiB, when 4 GiB are asked."""
    free, _ = torch.cuda.mem_get_info()
    blocks = (free - 1024 * MiB) // (256 * MiB)
    segment = torch.empty(blocks * 256 * MiB, dtype=torch.uint8, device="cuda")
    del segment
    carved = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(blocks)]
    held = carved[0::2]
    del carved
    ask_too_much(4096 * MiB, expect)
    return held


def oom_limit(expect):
    torch.cuda.set_per_process_memory_fraction(0.05)
    held = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
    ask_too_much(8192 * MiB, expect)
    return held


def nvml_used():
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return p.usedGpuMemory
    except Exception as err:  # said in the output, checked as missing
        print(f"nvml: {err}", file=sys.stderr)
    return -1


def graph_pools():
    """torch.cuda.memory_snapshot()'s CUDA graph pools: their segments'
    bytes, and the bytes asked by the tensors live in them."""
    pools = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)]
    return (sum(s["total_size"] for s in pools),
            sum(b.get("requested_size", b["size"]) for s in pools for b in s["blocks"] if b["state"] == "active_allocated"))


def inactive_blocks():
    """torch.cuda.memory_snapshot()'s inactive blocks outside graph pools:
    their sum and the largest."""
    sizes = [b["size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) == (0, 0)
             for b in s["blocks"] if b["state"] == "inactive"]
    return sum(sizes), max(sizes, default=0)


def main():
    modes = {"train": train, "generate": generate, "compile": compiled, "vllm": vllm,
             "oom_demand": oom_demand, "oom_fragment": oom_fragment, "oom_limit": oom_limit}
    expect = {"pid": os.getpid(), "mode": sys.argv[1]}
    kept = modes[sys.argv[1]](expect)
    gc.collect()
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    expect.update(reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated(),
                  requested=stats.get("requested_bytes.all.current", -1), nvml=nvml_used())
    expect["inactive"], expect["largest_inactive"] = inactive_blocks()
    expect["graph_pools"], expect["requested_in_pools"] = graph_pools()
    print("done", flush=True)
    print("expect " + json.dumps(expect), flush=True)
    sys.stdin.readline()
    del kept


if __name__ == "__main__":
    main()
