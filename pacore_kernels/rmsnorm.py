"""RMSNorm with optional fused residual add (HF LlamaRMSNorm numerics)."""
from __future__ import annotations

import torch

from ._utils import HAS_TRITON, check, check_same_device, next_pow2, require_triton, tl, triton


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


# --- Triton ---------------------------------------------------------------------------------------
@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, H, eps,
                    HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    # One program per row; fp32 statistics, HF's roundings (sum and normalised value cast to the dtype).
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    dt = x.dtype
    x = x.to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        xs = (x + r).to(dt)  # HF adds the residual in the activation dtype
        tl.store(res_out_ptr + row * H + offs, xs, mask=mask)
        x = xs.to(tl.float32)
    var = tl.sum(x * x, 0) / H
    h = (x * tl.rsqrt(var + eps)).to(dt).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + offs, (h * w).to(dt), mask=mask)


def _rows(name: str, t: torch.Tensor) -> torch.Tensor:
    check(t.dim() >= 1 and t.stride(-1) == 1, f"{name}: last dim must be contiguous")
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Same contract as rmsnorm_ref; outputs are new contiguous tensors shaped like x."""
    require_triton()
    check(x.dtype in (torch.float32, torch.float16, torch.bfloat16), f"x: unsupported dtype {x.dtype}")
    H = x.shape[-1]
    check(weight.shape == (H,) and weight.is_contiguous(),
          f"weight must be contiguous [{H}], got {tuple(weight.shape)}")
    check(H <= 65536, f"hidden size {H} > 65536 is not supported")
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x in shape and dtype")
    check_same_device(x=x, weight=weight, residual=residual)
    x2 = _rows("x", x)
    r2 = _rows("residual", residual) if residual is not None else x2
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    if x2.shape[0] > 0:
        _rmsnorm_kernel[(x2.shape[0],)](x2, r2, weight, out, res_out, x2.stride(0), r2.stride(0), H, eps,
                                        HAS_RES=residual is not None, BLOCK=next_pow2(H),
                                        num_warps=4 if H <= 4096 else 8)
    return out if residual is None else (out, res_out)

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del rmsnorm_triton
