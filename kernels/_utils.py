"""Shared torch helpers for the reference kernels (see engine/kv_cache.py for the layout)."""
from __future__ import annotations

import torch


def masked_softmax_attend(scores: torch.Tensor, mask: torch.Tensor, v: torch.Tensor):
    """Attention from fp32 scores [..., M, L] with a boolean keep-mask (broadcastable) and fp32 V [..., L, D].

    Returns (out [..., M, D] normalised, lse [..., M] natural log). A row with nothing to attend
    to gets out 0 and lse -inf, never NaN.
    """
    scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # empty row: exp(-inf - 0) = 0
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, v) / denom.clamp_min(torch.finfo(torch.float32).tiny)
    lse = (m + torch.log(denom)).squeeze(-1)  # log(0) = -inf for an empty row
    return out, lse


def merge_attn_states(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor):
    """Exact merge of two normalised partial attention states over disjoint key sets.

    o* [..., D] (fp32), lse* [...] (fp32). A part with lse -inf contributes nothing; both -inf
    gives out 0 and lse -inf.
    """
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1 = torch.exp(lse1 - m)
    w2 = torch.exp(lse2 - m)
    s = w1 + w2
    out = (o1 * w1.unsqueeze(-1) + o2 * w2.unsqueeze(-1)) / s.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    return out, m + torch.log(s)


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)
