"""Where a real model's shim frames lie on the C stack, under CPython 3.12:
the offset of each C-level entry of the evaluation loop (its entry frame,
owner FRAME_OWNED_BY_CSTACK) from the innermost _PyCFrame, at three
allocation sites of model_cost.py's Llama (forward pre-hooks), in training
and in decoding. The field offsets are 3.12's (pystack/layout.go). Prints
each distinct stack once. Run on the GPU machine: python3 bench/gpu/shims.py
(bench/gpu/h200/shims.txt)."""
import ctypes

import model_cost

TSTATE_CFRAME, CFRAME_CURRENT, FRAME_PREVIOUS, FRAME_OWNER, OWNED_BY_CSTACK = 56, 0, 8, 70, 3
ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
seen = set()


def u64(address):
    return ctypes.c_uint64.from_address(address).value


def probe(site):
    cframe = u64(ctypes.pythonapi.PyThreadState_Get() + TSTATE_CFRAME)
    frame, offsets, frames = u64(cframe + CFRAME_CURRENT), [], 0
    while frame:
        if ctypes.c_uint8.from_address(frame + FRAME_OWNER).value == OWNED_BY_CSTACK:
            offsets.append(frame - cframe)
        else:
            frames += 1
        frame = u64(frame + FRAME_PREVIOUS)
    if (site, tuple(offsets)) not in seen:
        seen.add((site, tuple(offsets)))
        print(site, "frames", frames, "shims", len(offsets), "offsets", offsets, flush=True)


model, opt, batch, prompt = model_cost.build()
layer = model.model.layers[3]
layer.self_attn.q_proj.register_forward_pre_hook(lambda m, a: probe("q_proj"))
layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: probe("down_proj"))
model.lm_head.register_forward_pre_hook(lambda m, a: probe("lm_head"))
model_cost.train_step(model, opt, batch)
model_cost.generate(model, prompt)
