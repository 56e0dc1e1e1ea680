"""Loading a checkpoint holds its weights once: the peak of live tensor bytes while loading a bf16
checkpoint stays near the checkpoint's size (building in fp32 and casting peaked at ~2x)."""
import weakref

import torch
from safetensors import safe_open
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bench.gpu.checkpoint import TINY, write_random_model
from engine.config import ModelConfig
from engine.worker.loader import load_model


class PeakBytes(TorchDispatchMode):
    """Live bytes of the storages every torch op allocates (freed when the storage dies); the peak.
    CPU has no allocator statistics like torch.cuda.max_memory_allocated, so count at the op level."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.storages: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.storages.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key, n = st.data_ptr(), st.nbytes()
                if n and key not in self.storages:
                    self.storages.add(key)
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(st, self._freed, key, n)
        return out


def test_bf16_load_peaks_near_the_checkpoint_size(tmp_path):
    # 8 layers keep the largest tensor (the embedding; one tensor is read at a time) < 10% of the total.
    folder = write_random_model(tmp_path / "m", dict(TINY, num_hidden_layers=8), dtype="bfloat16")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        size = sum(f.get_tensor(k).nbytes for k in f.keys())
    cfg = ModelConfig.from_pretrained(folder)
    with PeakBytes() as mem:
        model = load_model(cfg, torch.bfloat16, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert size <= mem.peak < 1.1 * size, (mem.peak, size)
