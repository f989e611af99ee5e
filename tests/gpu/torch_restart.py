"""A transformers Llama whose agent restarts under it (run_restart.sh):
built from a config on the GPU (its weights allocated under
LlamaForCausalLM.__init__), then trained with AdamW in two rounds, each
while no agent runs.

Protocol: prints "ready PID", waits for a line; builds the model, prints
"weights {JSON}" (pid, comm, init_reserved: the growth of
memory_reserved() while the model was built, the segments allocated under
LlamaForCausalLM.__init__; parameters: their bytes), waits for a line;
trains STEPS steps, prints "trained {JSON}" (reserved), waits for a line;
trains again, prints "trained {JSON}", waits for a line, exits.
"""
import json
import os
import sys

import torch

STEPS = 3


def llama(layers=4, hidden=1024):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
    with torch.device("cuda"):
        return LlamaForCausalLM(config)


def train(model, opt):
    for _ in range(STEPS):
        ids = torch.randint(0, 32000, (4, 256), device="cuda")
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # the gradients stay: memory that grew while no agent ran
    torch.cuda.synchronize()
    return {"reserved": torch.cuda.memory_reserved()}


def main():
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
    torch.cuda.init()
    before = torch.cuda.memory_reserved()
    model = llama()
    torch.cuda.synchronize()
    weights = {"pid": os.getpid(), "comm": open("/proc/self/comm").read().strip(),
               "init_reserved": torch.cuda.memory_reserved() - before,
               "parameters": sum(p.numel() * p.element_size() for p in model.parameters())}
    print("weights " + json.dumps(weights), flush=True)
    sys.stdin.readline()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):
        print("trained " + json.dumps(train(model, opt)), flush=True)
        sys.stdin.readline()


if __name__ == "__main__":
    main()
