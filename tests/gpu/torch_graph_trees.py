"""A transformers Llama under CUDA graphs, for checking gpu-mem's tensor view
against torch's own books (torch.cuda.memory_stats()'s requested_bytes).

Usage: torch_graph_trees.py SCENARIO, one of
  reduce-overhead-infer   torch.compile(mode="reduce-overhead"): Inductor's CUDA
  reduce-overhead-train   graph trees, several input shapes (several graphs in one
  max-autotune-infer      tree); inference, or training with the backward captured
  max-autotune-train      (SGD steps)
  graph-pool              torch.cuda.graph captures sharing one pool, largest batch
                          first (as vLLM captures), then replays

The model is built from a LlamaConfig (4 layers, hidden 1024, bf16): nothing
is downloaded. Protocol (tests/gpu/run_graphs.sh): prints "ready PID", waits
for a line; runs half of its steps, then prints "live tensor_live=BYTES
tensor_peak=BYTES reserved=BYTES pool_reserved=BYTES pool_requested=BYTES"
(requested_bytes.all.current and .peak, reserved_bytes.all.current, and the
bytes of the segments of private pools, the CUDA graphs', in
torch.cuda.memory_snapshot() and their live tensors' requests) and waits
for a line; runs the rest, prints "done" and "expect ..." (the same values)
while holding its tensors (the model, the last outputs kept by clone),
waits for a line, exits.

With GRAPH_SEGMENTS=DIR, torch records its memory history (Python stacks)
and each of those moments also writes DIR/segments-WHAT.json: every
segment of GPU 0 (address, size, pool, stream, the Python frames that
allocated it), to tell which segments a mismatch is made of.
"""
import json
import os
import sys

import torch

# GRAPH_SHAPES=N runs the first N shapes only (max-autotune's autotuning
# takes minutes a shape).
SHAPES = [(2, 64), (4, 128), (1, 32), (8, 96)][:int(os.environ.get("GRAPH_SHAPES", 4))]
ITERATIONS = 4  # per shape: warm-up, recording, replays


def requested():
    s = torch.cuda.memory_stats()
    return s["requested_bytes.all.current"], s["requested_bytes.all.peak"]


def private_pools():
    """The segments of GPU 0 in private pools (segment_pool_id not (0, 0):
    the CUDA graphs' here), as torch.cuda.memory_snapshot() has them: their
    bytes, and what their live tensors asked for."""
    segments = [s for s in torch.cuda.memory_snapshot() if s["device"] == 0 and tuple(s["segment_pool_id"]) != (0, 0)]
    return sum(s["total_size"] for s in segments), sum(s["requested_size"] for s in segments)


def dump_segments(what):
    out = os.environ.get("GRAPH_SEGMENTS")
    if not out:
        return
    segments = [{"address": s["address"], "size": s["total_size"], "pool": list(s["segment_pool_id"]),
                 "stream": s["stream"], "frames": [f"{f['name']} {os.path.basename(f['filename'])}:{f['line']}"
                                                    for f in s.get("frames", []) if f["filename"].endswith(".py")][:12]}
                for s in torch.cuda.memory_snapshot() if s["device"] == 0]
    with open(os.path.join(out, f"segments-{what}.json"), "w") as f:
        json.dump(segments, f, indent=1)


def say(what):
    torch.cuda.synchronize()
    dump_segments(what)
    live, peak = requested()
    pool, pool_requested = private_pools()
    reserved = torch.cuda.memory_stats()["reserved_bytes.all.current"]
    print(f"{what} tensor_live={live} tensor_peak={peak} reserved={reserved} pool_reserved={pool} "
          f"pool_requested={pool_requested}", flush=True)


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    return model, config.vocab_size


def compiled_steps(mode, train):
    """Yields after each shape's iterations; keeps the last logits' clone."""
    model, vocab = build_model()
    model.train(train)
    compiled = torch.compile(model, mode=mode)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4) if train else None
    kept = []
    for shape in SHAPES:
        for _ in range(ITERATIONS):
            torch.compiler.cudagraph_mark_step_begin()
            ids = torch.randint(0, vocab, shape, device="cuda")
            if train:
                out = compiled(input_ids=ids, labels=ids, use_cache=False)
                out.loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    out = compiled(input_ids=ids, use_cache=False)
            kept[:] = [out.logits.detach().clone()]
            del out
        yield
    steps_done.append((model, opt, kept))


def graph_pool_steps():
    """torch.cuda.graph with a shared pool, largest batch first, then replays."""
    model, vocab = build_model()
    model.eval()
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    batches = [8, 4, 2, 1]
    for i, bs in enumerate(batches):
        static = torch.randint(0, vocab, (bs, 64), device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                model(input_ids=static, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool), torch.no_grad():
            out = model(input_ids=static, use_cache=False).logits
        graphs[bs] = (g, static, out)
        if i == 1:
            yield
    kept = []
    for bs, (g, static, out) in graphs.items():
        static.copy_(torch.randint(0, vocab, static.shape, device="cuda"))
        for _ in range(3):
            g.replay()
        kept.append(out.clone())
    yield
    steps_done.append((model, graphs, kept))


steps_done = []


def main():
    scenario = sys.argv[1]
    modes = {"reduce-overhead-infer": ("reduce-overhead", False), "reduce-overhead-train": ("reduce-overhead", True),
             "max-autotune-infer": ("max-autotune", False), "max-autotune-train": ("max-autotune", True)}
    torch.cuda.init()
    if os.environ.get("GRAPH_SEGMENTS"):
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=1000000)
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    steps = graph_pool_steps() if scenario == "graph-pool" else compiled_steps(*modes[scenario])
    n = len(SHAPES) if scenario != "graph-pool" else 2
    for i, _ in enumerate(steps):
        if i == n // 2 - 1:
            say("live")
            sys.stdin.readline()
    torch.cuda.synchronize()
    print("done", flush=True)
    say("expect")
    sys.stdin.readline()


if __name__ == "__main__":
    main()
