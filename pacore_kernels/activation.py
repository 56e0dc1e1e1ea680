"""SiLU-and-mul (the gated MLP activation)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._utils import HAS_TRITON, check, next_pow2, require_triton, tl, triton


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] = [gate | up] -> silu(gate) * up [T, I]; HF numerics (silu rounded to dtype, then mul)."""
    i = x.shape[-1] // 2
    return F.silu(x[..., :i]) * x[..., i:]


# --- Triton ---------------------------------------------------------------------------------------
@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, I, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    g = tl.load(x_ptr + t * stride_x + offs, mask=mask, other=0.0)
    dt = g.dtype
    g = g.to(tl.float32)
    u = tl.load(x_ptr + t * stride_x + I + offs, mask=mask, other=0.0).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # HF: silu rounded to the dtype, then the mul
    tl.store(out_ptr + t * I + offs, (a * u).to(dt), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """Same contract as silu_and_mul_ref; x [..., 2I] with a contiguous last dim."""
    require_triton()
    check(x.dim() >= 1 and x.shape[-1] % 2 == 0 and x.stride(-1) == 1, "x must be [..., 2I], last dim contiguous")
    check(x.dtype in (torch.float32, torch.float16, torch.bfloat16), f"x: unsupported dtype {x.dtype}")
    I = x.shape[-1] // 2
    x2 = x if x.dim() == 2 else x.reshape(-1, 2 * I)
    out = torch.empty(*x.shape[:-1], I, dtype=x.dtype, device=x.device)
    if x2.shape[0] > 0 and I > 0:
        block = min(1024, next_pow2(I))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(I, block))](x2, out, x2.stride(0), I, BLOCK=block,
                                                                    num_warps=4)
    return out

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del silu_and_mul_triton
