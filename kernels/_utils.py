"""Shared torch helpers for the reference kernels (see engine/kv_cache.py for the layout)."""
from __future__ import annotations

import torch


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache [N, bs, Hkv, D], blocks int64 [..., W] -> fp32 [Hkv, ..., W * bs, D], a fresh tensor.

    Two passes over the gathered bytes: a row gather of whole blocks (memcpy-like), then one copy
    that both moves Hkv first (so the matmuls batch over (Hkv, ...) without further copies) and
    converts to fp32.
    """
    _, bs, Hkv, D = cache.shape
    nd = blocks.dim()
    g = cache.index_select(0, blocks.reshape(-1)).view(*blocks.shape, bs, Hkv, D)
    perm = (nd + 1, *range(nd - 1), nd - 1, nd, nd + 2)  # [..., W, bs, Hkv, D] -> [Hkv, ..., W, bs, D]
    g = g.permute(perm)
    out = torch.empty(g.shape, dtype=torch.float32, device=cache.device)
    out.copy_(g)
    return out.flatten(-3, -2)


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


# --- Triton import shim --------------------------------------------------------------------------
# The references must work where triton is absent; kernel modules still define their @triton.jit
# functions, so give them an inert `triton`/`tl` (jit is the identity, every tl.* attribute is None).
try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except Exception:  # pragma: no cover - exercised only on hosts without triton
    HAS_TRITON = False

    class _Inert:
        def jit(self, fn=None, **_):
            return fn if fn is not None else (lambda f: f)

        def __getattr__(self, name):
            return None

    triton = tl = _Inert()


def require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("triton is not importable; use the *_ref kernels")


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def check_rows(name: str, t: torch.Tensor, ndim: int) -> None:
    """A [rows, ..., D] tensor whose inner dims are packed (rows may be strided, e.g. a view into qkv)."""
    check(t.dim() == ndim, f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    inner = 1
    for d in range(ndim - 1, 0, -1):
        check(t.stride(d) == inner or t.shape[d] == 1,
              f"{name}: inner dims must be contiguous (strides {t.stride()}, shape {tuple(t.shape)})")
        inner *= t.shape[d]


def check_same_device(**tensors) -> None:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    check(len(set(devs.values())) <= 1, f"tensors on different devices: {devs}")


def check_int(name: str, t: torch.Tensor) -> None:
    check(t.dtype in (torch.int32, torch.int64), f"{name}: expected int32/int64, got {t.dtype}")
    check(t.is_contiguous(), f"{name}: must be contiguous")


def check_attn_dtypes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    check(q.dtype in (torch.float32, torch.float16, torch.bfloat16), f"q: unsupported dtype {q.dtype}")
    check(k_cache.dtype == q.dtype and v_cache.dtype == q.dtype,
          f"q/k_cache/v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
          f"caches must be [N, bs, Hkv, D] and equal: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache/v_cache must be contiguous")
    Hq, D = q.shape[-2:]
    Hkv = k_cache.shape[2]
    check(k_cache.shape[3] == D, f"head_dim mismatch: q {D}, cache {k_cache.shape[3]}")
    check(Hq % Hkv == 0, f"num q heads {Hq} is not a multiple of num kv heads {Hkv}")
