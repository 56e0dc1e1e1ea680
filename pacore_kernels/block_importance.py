"""Verification-guided block importance (Vegas-style self-drafting): what a verify pass's attention says
about each KV block of a row, emitted by the verify attention kernels (paged decode multi-query and
cascade decode, Triton and torch) as a by-product, only when asked.

Importance of row b's block n (block-table column n): the largest attention probability exp(s - lse)
any of the row's queries, in any query head, gave a key of that block; 0 for a block no query read.
The max normalised score rather than the block's summed mass: a maximum is the same whichever split,
tile or stage saw the block's keys, so it needs no per-split bookkeeping (a summed mass would have to be
carried per split and rescaled at the merge).

Reduced per row, not per KV head: a draft step reads one reduced block table per row and layer, shared
by its heads (pacore_kernels/block_select.py), so a per-head importance would be reduced to one set per
row anyway. Max over the heads keeps a block that one head needs.

Two stages, the same on both paths:
1. while attending, fold each score's raw value (natural-log units, scale applied) into ``block_max``
   fp32 [T, Hq, W] by a max (the kernels' lse is per split until the merge, so the normalisation waits);
2. ``finish_importance``: once the final lse [T, Hq] is known, exp(block_max - lse), reduced over the
   heads and over each row's queries into importance fp32 [B, W]. Torch ops of fixed shape, no host
   read: CUDA-graph capturable.
The Triton kernels fold by an atomic max (``fold_block_max`` in _utils.py, inlined into them).
Memory: the [T, Hq, W] scratch, 4 bytes per (query row, q head, block-table column), reused by every layer.
"""
from __future__ import annotations

import torch

from ._utils import check


def new_block_max(importance: torch.Tensor, q: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """The stage-1 scratch for ``importance`` [B, W] (B, W: block_tables' shape) of queries q [T, Hq, D]:
    fp32 [T, Hq, W] of -inf (nothing seen yet)."""
    check(importance.dtype == torch.float32 and importance.is_contiguous() and importance.shape == block_tables.shape
          and importance.device == q.device, f"importance must be a contiguous fp32 tensor shaped like block_tables "
          f"{tuple(block_tables.shape)} on {q.device}, got {importance.dtype} {tuple(importance.shape)} on {importance.device}")
    return torch.full((q.shape[0], q.shape[1], importance.shape[1]), float("-inf"), dtype=torch.float32, device=q.device)


def fold_block_max_ref(block_max: torch.Tensor, scores: torch.Tensor, cols: torch.Tensor, block_size: int) -> None:
    """Fold masked (-inf) scores [N, Hq, C * block_size], whose keys are the blocks at block-table columns
    ``cols`` [N, C] (int64, in range), into block_max [N, Hq, W] by a max, in place."""
    N, Hq, _ = scores.shape
    per_block = scores.reshape(N, Hq, -1, block_size).amax(-1)            # [N, Hq, C]
    block_max.scatter_reduce_(2, cols[:, None, :].expand(N, Hq, -1), per_block, "amax")


def finish_importance(block_max: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor | None,
                      importance: torch.Tensor) -> torch.Tensor:
    """importance [B, W] (written in place and returned): per row and block, the max over the row's
    queries and heads of exp(block_max - lse). Query rows past cu_seqlens_q[-1] (a graph's padding) and
    queries that saw no key (lse -inf) count for nothing."""
    T = block_max.shape[0]
    B = importance.shape[0]
    t = torch.arange(T, device=block_max.device)
    if cu_seqlens_q is None:
        row, ok = t, t < B
    else:  # the row of each packed query, found on the device (no sync)
        cu = cu_seqlens_q.to(device=block_max.device, dtype=torch.int64)
        row, ok = torch.searchsorted(cu[1:], t, right=True), t < cu[-1]
    seen = torch.isfinite(lse)[..., None] & (block_max > float("-inf"))
    p = torch.where(seen, torch.exp(block_max - torch.where(seen, lse[..., None], 0.0)), 0.0).amax(1)  # [T, W]
    importance.zero_()
    importance.scatter_reduce_(0, row.clamp(max=max(B - 1, 0))[:, None].expand_as(p), p * ok[:, None], "amax")
    return importance
