"""A vLLM-shaped model runner for tests/gpu/torch_breakdown.py: its
methods carry vLLM's names (GPUModelRunner.load_model,
initialize_kv_cache, _allocate_kv_cache_tensors) and its file lies under a
folder named vllm, as vLLM's does, so that gpu-mem's shipped rules for
vLLM sort its memory."""
import torch


class GPUModelRunner:
    def __init__(self, layers, hidden, blocks, block_size):
        self.layers, self.hidden, self.blocks, self.block_size = layers, hidden, blocks, block_size

    def load_model(self):
        self.weights = [torch.empty(self.hidden, self.hidden, device="cuda", dtype=torch.float16) for _ in range(self.layers)]

    def initialize_kv_cache(self):
        self.kv_caches = self._allocate_kv_cache_tensors()

    def _allocate_kv_cache_tensors(self):
        shape = (2, self.blocks, self.block_size, self.hidden)
        return [torch.zeros(shape, device="cuda", dtype=torch.float16) for _ in range(self.layers)]

    def execute_model(self, batch):
        x = torch.randn(batch, self.hidden, device="cuda", dtype=torch.float16)
        for w in self.weights:
            x = x @ w
        return x
