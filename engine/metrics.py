"""Per-step timeline records, for profiling rounds and KV-sharing research."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class StepRecord:
    step: int
    kind: str                 # "prefill", "decode" or "mixed"
    num_prefill_seqs: int
    num_decode_seqs: int
    num_tokens: int
    cascade: bool
    schedule_s: float         # host: choosing the batch, allocating blocks
    model_s: float            # batch tensors + forward + logits (synchronised on CUDA)
    sample_s: float           # sampling, stop checks, forks, finishing requests
    kv_blocks_used: int       # physical blocks held
    kv_blocks_shared: int     # of those, blocks with ref count > 1
    kv_blocks_logical: int    # blocks the same sequences would hold without any sharing

    def to_dict(self) -> dict:
        return asdict(self)
