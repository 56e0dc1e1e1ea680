"""Prefill / chunked-prefill attention over the paged KV cache (causal, packed varlen queries)."""
from __future__ import annotations

import torch

from ._utils import masked_softmax_attend

# Cap on fp32 score elements per step of the reference, so long prompts do not blow up memory.
_REF_MAX_SCORES = 1 << 25


def prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                          sm_scale: float) -> torch.Tensor:
    """q [Tq, Hq, D]; query i of sequence s sits at position seq_lens[s] - q_len_s + i and attends
    causally to cache positions 0..=that position. Returns out [Tq, Hq, D] in q.dtype."""
    Tq, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    dev = q.device
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    ctx_lens = seq_lens.tolist()
    for s, ctx in enumerate(ctx_lens):
        q0, q1 = cu[s], cu[s + 1]
        n = q1 - q0
        if n <= 0:
            continue
        nb = (ctx + bs - 1) // bs
        blocks = block_tables[s, :nb].to(device=dev, dtype=torch.int64)
        k = k_cache[blocks].reshape(nb * bs, Hkv, D)[:ctx].float().permute(1, 2, 0)  # [Hkv, D, ctx]
        v = v_cache[blocks].reshape(nb * bs, Hkv, D)[:ctx].float().permute(1, 0, 2)  # [Hkv, ctx, D]
        qs = q[q0:q1].float().reshape(n, Hkv, G, D).permute(1, 2, 0, 3)               # [Hkv, G, n, D]
        qpos = torch.arange(ctx - n, ctx, device=dev)
        kpos = torch.arange(ctx, device=dev)
        step = max(1, _REF_MAX_SCORES // max(1, Hq * ctx))  # query rows per chunk
        for c0 in range(0, n, step):
            c1 = min(n, c0 + step)
            scores = torch.matmul(qs[:, :, c0:c1], k.unsqueeze(1)) * sm_scale        # [Hkv, G, c, ctx]
            keep = kpos[None, :] <= qpos[c0:c1, None]                                # causal
            o, _ = masked_softmax_attend(scores, keep, v.unsqueeze(1))
            out[q0 + c0:q0 + c1] = o.permute(2, 0, 1, 3).reshape(c1 - c0, Hq, D).to(q.dtype)
    return out
