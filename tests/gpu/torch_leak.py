"""Workloads of run_leak.sh (docs/leaks.md): a transformers Llama built from
a config on the GPU, in a loop that leaks, or one that does not.

Usage: torch_leak.py MODE [SECONDS]
  loss      an evaluation loop that sums its losses without .item() and
            without torch.no_grad(): each step's graph and the activations
            it saved stay (the classic `total_loss += loss`)
  outputs   an inference loop (no_grad) that appends each step's logits
            to a list
  steady    a training loop (AdamW, the loss read with .item()): nothing
            kept from step to step
  generate  a decode loop whose KV cache fills to 1024 tokens, then stays
            there (cropped a token a step)
  fill LEAVE_BYTES
            a neighbour: takes what leaves LEAVE_BYTES of the GPU free,
            prints "filled {JSON}" and holds it until stdin closes

Protocol (but fill): prints "ready PID", waits for a line; builds the
model, prints "built", waits for a line; then loops, a JSON line a step
({"t", "step", "allocated", "reserved"}: time.time() at the step's start,
memory_allocated() and memory_reserved() after it). loss and outputs run a
step a second; after five steps they print "rate {JSON}" (bytes_per_second:
memory_allocated()'s growth a second so far) and run until torch raises
out of memory, then print "oom {JSON}" (t) and exit. steady and generate
run flat out for SECONDS (default 180), then print "end" and exit.
"""
import json
import os
import sys
import time

import torch

PERIOD = 1.0  # seconds a leaking step takes, so that the GPU fills in minutes
RATE_STEPS = 5
MAX_TOKENS = 1024


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
    with torch.device("cuda"):
        return LlamaForCausalLM(config)


def report(step):
    torch.cuda.synchronize()
    print(json.dumps({"t": step["t"], "step": step["n"], "allocated": torch.cuda.memory_allocated(),
                      "reserved": torch.cuda.memory_reserved()}), flush=True)


def leak_loss_step(model, total_loss):
    ids = torch.randint(0, 32000, (1, 128), device="cuda")
    return total_loss + model(input_ids=ids, labels=ids).loss  # the graph of every step stays


def leak_outputs_step(model, outputs):
    with torch.no_grad():
        ids = torch.randint(0, 32000, (4, 256), device="cuda")
        outputs.append(model(input_ids=ids).logits)  # every step's logits stay


def leak(model, mode):
    kept = {"loss": torch.zeros((), device="cuda"), "outputs": []}
    start = torch.cuda.memory_allocated()
    t0 = time.time()
    n = 0
    while True:
        n += 1
        step = {"t": time.time(), "n": n}
        try:
            if mode == "loss":
                kept["loss"] = leak_loss_step(model, kept["loss"])
            else:
                leak_outputs_step(model, kept["outputs"])
            report(step)
        except torch.OutOfMemoryError:
            print("oom " + json.dumps({"t": time.time(), "step": n}), flush=True)
            return
        if n == RATE_STEPS:
            rate = (torch.cuda.memory_allocated() - start) / (time.time() - t0)
            print("rate " + json.dumps({"bytes_per_second": rate}), flush=True)
        time.sleep(max(0.0, step["t"] + PERIOD - time.time()))


def steady(model, seconds):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    total_loss, n, end = 0.0, 0, time.time() + seconds
    while time.time() < end:
        n += 1
        step = {"t": time.time(), "n": n}
        ids = torch.randint(0, 32000, (4, 256), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total_loss += loss.item()
        if n % 10 == 0:
            report(step)


def generate(model, seconds):
    from transformers import DynamicCache
    cache = DynamicCache()
    ids = torch.randint(0, 32000, (8, 1), device="cuda")
    n, end = 0, time.time() + seconds
    with torch.no_grad():
        while time.time() < end:
            n += 1
            step = {"t": time.time(), "n": n}
            if cache.get_seq_length() >= MAX_TOKENS:
                cache.crop(MAX_TOKENS - 1)  # full: the oldest context let go, as a sliding window does
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            ids = out.logits[:, -1:].argmax(-1)
            if n % 10 == 0:
                report(step)


def fill(leave):
    torch.cuda.init()
    free, _ = torch.cuda.mem_get_info()
    held = torch.empty(max(0, free - leave), dtype=torch.uint8, device="cuda")
    free, _ = torch.cuda.mem_get_info()
    print("filled " + json.dumps({"pid": os.getpid(), "held": held.numel(), "free": free}), flush=True)
    sys.stdin.read()


def main():
    mode = sys.argv[1]
    if mode == "fill":
        fill(int(sys.argv[2]))
        return
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 180
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    model = llama()
    torch.cuda.synchronize()
    print("built", flush=True)
    sys.stdin.readline()
    if mode in ("loss", "outputs"):
        leak(model, mode)
        return
    {"steady": steady, "generate": generate}[mode](model, seconds)
    print("end", flush=True)


if __name__ == "__main__":
    main()
