"""RMSNorm with optional fused residual add (HF LlamaRMSNorm numerics)."""
from __future__ import annotations

import torch


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Without residual: norm(x) * weight. With residual: (norm(x + residual) * weight, x + residual).

    Like HF: the residual add happens in the input dtype, the norm in fp32, and the weight multiplies
    after the cast back to the input dtype.
    """
    dtype = x.dtype
    if residual is not None:
        x = x + residual  # rounded to dtype, exactly as HF's `residual + hidden_states`
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * h.to(dtype)).to(dtype)
    return out if residual is None else (out, x)
