"""What gpu-mem costs a real model, measured inside one process.

A HuggingFace transformers Llama (8 layers, hidden 2048, 16 heads, bf16),
built from a config on the GPU (nothing downloaded), trained with AdamW on
batch 4 x 512 and decoded greedily at batch 1. Timing noise between
processes on the GPU machine is larger than the agent's cost (eager decode
moves +-25% from one process to the next), so the harness (model.sh) starts
and stops the agent between the windows of one process, and each mode is
measured in every round.

Protocol: prints "ready PID"; before each window prints "window MODE" and
waits for a line (the harness has the agent in that mode by then); then
warms up (stacks named, caches filled), measures, and prints
"result mode=MODE step_ms=... tok_s=... us_d5=... us_d40=...
allocs_step=... allocs_token=...": the median training step, decode tokens a
second (median of 3 generations), one torch.empty + del with the Python
stack 5 and 40 frames deep (median of 5 runs), and torch's own count of
tensor allocations a step and a token. Reads the windows' modes from its
arguments; exits after the last. MODEL_STEPS, MODEL_TOKENS and MODEL_EMPTIES
change how much a window measures (for runs with the caching allocator off,
where each is slow); MODEL_CPU pins the main thread to that CPU once the
model runs.
"""
import os
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from depth import at_depth, median_at_depth
from torch_bench import empty_and_del

STEPS = int(os.environ.get("MODEL_STEPS", 15))
NEW_TOKENS = int(os.environ.get("MODEL_TOKENS", 48))
EMPTIES = int(os.environ.get("MODEL_EMPTIES", 5000))


def build():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5504, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = torch.randint(0, cfg.vocab_size, (4, 512), device="cuda")
    prompt = torch.randint(0, cfg.vocab_size, (1, 32), device="cuda")
    return model, opt, batch, prompt


def allocations():
    return torch.cuda.memory_stats()["allocation.all.allocated"]


def train_step(model, opt, batch):
    model.train()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def step_ms(model, opt, batch):
    times = []
    for _ in range(STEPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        train_step(model, opt, batch)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def generate(model, prompt):
    model.eval()
    return model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                          pad_token_id=0)


def tokens_per_s(model, prompt):
    rates = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        generate(model, prompt)
        torch.cuda.synchronize()
        rates.append(NEW_TOKENS / (time.perf_counter() - start))
    return statistics.median(rates)


def window(mode, model, opt, batch, prompt):
    print(f"window {mode}", flush=True)
    sys.stdin.readline()
    # Warm-up under this mode: the agent names the stacks it sees first.
    for _ in range(3):
        train_step(model, opt, batch)
    generate(model, prompt)
    at_depth(5, empty_and_del, 2000)
    at_depth(40, empty_and_del, 2000)
    d5 = median_at_depth(5, empty_and_del, EMPTIES)
    d40 = median_at_depth(40, empty_and_del, EMPTIES)
    a = allocations()
    ms = step_ms(model, opt, batch)
    per_step = (allocations() - a) / STEPS
    a = allocations()
    tok = tokens_per_s(model, prompt)
    per_token = (allocations() - a) / (3 * NEW_TOKENS)
    print(f"result mode={mode} step_ms={ms:.3f} tok_s={tok:.2f} us_d5={d5:.3f} us_d40={d40:.3f} "
          f"allocs_step={per_step:.0f} allocs_token={per_token:.1f}", flush=True)


def main():
    model, opt, batch, prompt = build()
    train_step(model, opt, batch)
    generate(model, prompt)
    if "MODEL_CPU" in os.environ:
        # This thread alone (PyTorch's started above keep every CPU).
        os.sched_setaffinity(0, {int(os.environ["MODEL_CPU"])})
    print(f"ready {os.getpid()}", flush=True)
    for mode in sys.argv[1:]:
        window(mode, model, opt, batch, prompt)


if __name__ == "__main__":
    main()
