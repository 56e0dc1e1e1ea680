"""Rotary position embedding, NeoX / HF rotate_half style, applied in place to q and k."""
from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Exactly HF's `x * cos + rotate_half(x) * sin`, in x's dtype, with cos/sin of width D/2.
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """positions int64 [T]; q [T, Hq, D]; k [T, Hkv, D]; cos_sin_cache fp32 [max_pos, D] = [cos | sin].

    HF computes cos/sin in fp32 and casts them to the activation dtype before the multiply; so do we.
    """
    D = q.shape[-1]
    cs = cos_sin_cache[positions.to(torch.int64)]
    cos = cs[:, None, : D // 2]
    sin = cs[:, None, D // 2:]
    q.copy_(_rotate(q, cos.to(q.dtype), sin.to(q.dtype)))
    k.copy_(_rotate(k, cos.to(k.dtype), sin.to(k.dtype)))
    return q, k
