"""Rotary position embedding, NeoX / HF rotate_half style, applied in place to q and k."""
from __future__ import annotations

import torch

from ._utils import HAS_TRITON, check, check_rows, check_same_device, next_pow2, require_triton, tl, triton


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


# --- Triton ---------------------------------------------------------------------------------------
@triton.jit
def _rotate_heads(x_ptr, stride_t, t, H, c, s, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    mask = (h[:, None] < H) & (j[None, :] < HALF)
    p1 = x_ptr + t * stride_t + h[:, None] * (2 * HALF) + j[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    c = c.to(dt).to(tl.float32)[None, :]  # HF casts cos/sin to the activation dtype first
    s = s.to(dt).to(tl.float32)[None, :]
    # Each product is rounded to the dtype before the add, as HF's `x * cos + rotate_half(x) * sin` does.
    o1 = (x1 * c).to(dt).to(tl.float32) - (x2 * s).to(dt).to(tl.float32)
    o2 = (x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)
    tl.store(p1, o1.to(dt), mask=mask)
    tl.store(p1 + HALF, o2.to(dt), mask=mask)


@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, cs_ptr, stride_q, stride_k, HQ, HKV,
                 HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # One program per token: read its cos/sin row once, rotate all q and k heads in place.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    c = tl.load(cs_ptr + pos * (2 * HALF) + j, mask=j < HALF, other=0.0)
    s = tl.load(cs_ptr + pos * (2 * HALF) + HALF + j, mask=j < HALF, other=0.0)
    _rotate_heads(q_ptr, stride_q, t, HQ, c, s, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, stride_k, t, HKV, c, s, HALF, BLOCK_HKV, BLOCK_HALF)


def rope_triton(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """Same contract as rope_ref (in place, returns q, k). q/k may be row-strided views (e.g. into qkv)."""
    require_triton()
    check_rows("q", q, 3)
    check_rows("k", k, 3)
    T, Hq, D = q.shape
    check(k.shape[0] == T and k.shape[2] == D, f"k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    check(D % 2 == 0, f"head_dim {D} must be even")
    check(q.dtype == k.dtype and q.dtype in (torch.float32, torch.float16, torch.bfloat16), "q/k dtype")
    check(cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == D and cos_sin_cache.is_contiguous()
          and cos_sin_cache.dtype == torch.float32, f"cos_sin_cache must be contiguous fp32 [max_pos, {D}]")
    check(positions.shape == (T,) and positions.dtype in (torch.int32, torch.int64) and positions.is_contiguous(),
          "positions must be contiguous int [T]")
    check_same_device(positions=positions, q=q, k=k, cos_sin_cache=cos_sin_cache)
    if T > 0:
        _rope_kernel[(T,)](positions, q, k, cos_sin_cache, q.stride(0), k.stride(0), Hq, k.shape[1],
                           HALF=D // 2, BLOCK_HQ=next_pow2(Hq), BLOCK_HKV=next_pow2(k.shape[1]),
                           BLOCK_HALF=next_pow2(D // 2), num_warps=4)
    return q, k

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del rope_triton
