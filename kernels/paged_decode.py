"""Decode attention (one query token per sequence) over the paged KV cache."""
from __future__ import annotations

import torch

from ._utils import masked_softmax_attend


def paged_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
                     start_lens: torch.Tensor | None = None, return_lse: bool = False):
    """q [B, Hq, D] attends to the tokens [start_lens[b], seq_lens[b]) of sequence b.

    Returns out [B, Hq, D] (q.dtype), plus lse fp32 [B, Hq] when return_lse. Empty range: out 0, lse -inf.
    Vectorised: gathers only the blocks spanning [start, seq) for every row (a window of W blocks).
    """
    B, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    dev = q.device
    seq = seq_lens.to(device=dev, dtype=torch.int64)
    start = torch.zeros_like(seq) if start_lens is None else start_lens.to(device=dev, dtype=torch.int64)
    start = torch.minimum(start, seq)
    first_blk = start // bs
    n_blk = (seq + bs - 1) // bs - first_blk
    W = int(n_blk.max().item()) if B > 0 else 0
    if W <= 0:
        out = torch.zeros_like(q)
        lse = torch.full((B, Hq), float("-inf"), dtype=torch.float32, device=dev)
        return (out, lse) if return_lse else out

    cols = first_blk[:, None] + torch.arange(W, device=dev)  # [B, W] block-table columns
    cols_ok = cols < ((seq + bs - 1) // bs)[:, None]           # never use padding entries
    cols_c = torch.where(cols_ok, cols, torch.zeros_like(cols)).clamp_max(block_tables.shape[1] - 1)
    blocks = torch.gather(block_tables.to(device=dev, dtype=torch.int64), 1, cols_c)
    blocks = torch.where(cols_ok, blocks, torch.zeros_like(blocks))
    k = k_cache[blocks].reshape(B, W * bs, Hkv, D).float()  # [B, L, Hkv, D]
    v = v_cache[blocks].reshape(B, W * bs, Hkv, D).float()
    pos = (cols[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(B, W * bs)  # token positions
    keep = (pos >= start[:, None]) & (pos < seq[:, None]) & cols_ok.repeat_interleave(bs, dim=1)

    v = v.masked_fill(~keep[:, :, None, None], 0.0)  # masked slots may hold garbage (even NaN): 0 * NaN = NaN
    qf = q.float().reshape(B, Hkv, G, D)
    scores = torch.matmul(qf, k.permute(0, 2, 3, 1)) * sm_scale    # [B, Hkv, G, L]
    out, lse = masked_softmax_attend(scores, keep[:, None, None, :], v.permute(0, 2, 1, 3))
    out = out.reshape(B, Hq, D).to(q.dtype)
    lse = lse.reshape(B, Hq)
    return (out, lse) if return_lse else out
