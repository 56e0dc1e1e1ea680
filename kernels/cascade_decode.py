"""Cascade (prefix-shared) decode: shared prefix once per group + per-row suffix, merged by LSE."""
from __future__ import annotations

import torch

from ._utils import masked_softmax_attend, merge_attn_states
from .paged_decode import paged_decode_ref


def cascade_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor, group_starts: torch.Tensor,
                       group_prefix_lens: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """q [B, Hq, D]; groups per engine/kv_cache.py. Returns out [B, Hq, D] in q.dtype."""
    B, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    dev = q.device
    starts = group_starts.tolist()
    plens = group_prefix_lens.tolist()
    sizes = torch.tensor([starts[g + 1] - starts[g] for g in range(len(plens))], device=dev)
    row_prefix = torch.repeat_interleave(group_prefix_lens.to(device=dev, dtype=torch.int64), sizes,
                                         output_size=B)

    # Stage 1: every query row of a group (members x q heads per kv head) against the prefix, once.
    o1 = torch.zeros(B, Hq, D, dtype=torch.float32, device=dev)
    lse1 = torch.full((B, Hq), float("-inf"), dtype=torch.float32, device=dev)
    qf = q.float()
    for g, plen in enumerate(plens):
        r0, r1 = starts[g], starts[g + 1]
        if plen <= 0 or r1 <= r0:
            continue
        blocks = block_tables[r0, : plen // bs].to(device=dev, dtype=torch.int64)
        kp = k_cache[blocks].reshape(plen, Hkv, D).float().permute(1, 2, 0)  # [Hkv, D, P]
        vp = v_cache[blocks].reshape(plen, Hkv, D).float().permute(1, 0, 2)  # [Hkv, P, D]
        n = r1 - r0
        qg = qf[r0:r1].reshape(n, Hkv, G, D).permute(1, 0, 2, 3).reshape(Hkv, n * G, D)
        scores = torch.matmul(qg, kp) * sm_scale                             # [Hkv, n*G, P]
        keep = torch.ones(1, 1, plen, dtype=torch.bool, device=dev)
        o, l = masked_softmax_attend(scores, keep, vp)
        o1[r0:r1] = o.reshape(Hkv, n, G, D).permute(1, 0, 2, 3).reshape(n, Hq, D)
        lse1[r0:r1] = l.reshape(Hkv, n, G).permute(1, 0, 2).reshape(n, Hq)

    # Stage 2: each row's own suffix [prefix_len, seq_len), then the exact merge.
    q2 = q if q.dtype == torch.float32 else qf
    o2, lse2 = paged_decode_ref(q2, k_cache, v_cache, block_tables, seq_lens, sm_scale,
                                start_lens=row_prefix, return_lse=True)
    out, _ = merge_attn_states(o1, lse1, o2.float(), lse2)
    return out.to(q.dtype)
