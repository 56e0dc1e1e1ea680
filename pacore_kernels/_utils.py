"""Shared helpers: torch ones for the reference kernels (see engine/worker/kv_cache.py for the layout), checks,
and the Triton device functions of the attention kernels (online softmax over paged K/V)."""
from __future__ import annotations

import os

import torch

# FP8 caches (engine/worker/kv_cache.py): values stored as saturate(x / scale), read as stored * scale.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an FP8 format: 448 (e4m3fn), 57344 (e5m2)."""
    return float(torch.finfo(dtype).max)


def quantize_fp8(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x / scale in ``dtype``, saturated at the format's largest finite value (never inf or NaN for
    finite x). Multiplies by the fp32 reciprocal, as the Triton store does, so both round alike."""
    m = fp8_max(dtype)
    return (x.float() * (1.0 / scale)).clamp_(-m, m).to(dtype)


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """cache [N, bs, Hkv, D], blocks int64 [..., W] -> fp32 [Hkv, ..., W * bs, D], a fresh tensor,
    times ``scale`` (an FP8 cache's dequantization factor).

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
    if scale != 1.0:
        out.mul_(scale)
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


# --- Triton device helpers (inlined into the attention kernels) ------------------------------------
# The flash-attention online softmax shared by paged decode, cascade decode and prefill. Scores are kept
# in the log2 domain: callers fold log2(e) into qk_scale, so exp2 replaces exp.

_LN2 = tl.constexpr(0.6931471805599453) if HAS_TRITON else None  # lse is reported in natural log
# Under the CPU interpreter (TRITON_INTERPRET=1 when this module is imported, which is also when @triton.jit
# picks the interpreter) tl.dot's bf16 path returns garbage. There the attention dots take their operands
# upcast to fp32 with exact products, which is what a GPU's bf16 MMA computes (exact products, fp32
# accumulation) up to the summation order; everything else (bf16 loads and stores, p rounded to q's dtype
# before PV, the FP8 upcast) runs as compiled. Compiled kernels never take this branch.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1") if HAS_TRITON else None


@triton.jit
def attn_dot(a, b, DOT_PREC: tl.constexpr):
    """a @ b with fp32 accumulation: a and b in one dtype (fp32, fp16 or bf16)."""
    if _INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PREC)


@triton.jit
def load_kv_tile(kc_ptr, vc_ptr, bt_row, pos, ok, h, d, stride_tok, BS: tl.constexpr, D: tl.constexpr):
    """K and V [BLOCK_N, BLOCK_D] of kv head h at token positions pos of one sequence, whose block-table
    row starts at bt_row. Masked keys (ok false) and padding dims (d >= D) read 0."""
    blk = tl.load(bt_row + pos // BS, mask=ok, other=0).to(tl.int64)
    slot = blk * BS + pos % BS                        # int64: block ids * sizes overflow int32
    kv_off = slot[:, None] * stride_tok + h * D + d[None, :]
    kv_ok = ok[:, None] & (d[None, :] < D)
    k = tl.load(kc_ptr + kv_off, mask=kv_ok, other=0.0)
    v = tl.load(vc_ptr + kv_off, mask=kv_ok, other=0.0)
    return k, v


@triton.jit
def online_softmax_tile(q, k, v, keep, qk_scale, m_i, l_i, acc, DOT_PREC: tl.constexpr):
    """One key tile of the online softmax: scores q @ k^T (keep false -> -inf; keep None: every key is
    kept, no mask is applied), then the running max m_i, the running sum l_i of exp2 and the
    unnormalised output acc are rescaled and updated. Returns them.

    A row that has kept no key yet (max still -inf, possible only with a mask) stays at l_i = 0, acc = 0."""
    # An FP8 tile is upcast here, in registers, to q's dtype (exact: every FP8 value is a bf16/fp16
    # value); its K scale is folded into qk_scale and its V scale applied to the output by the caller.
    s = attn_dot(q, tl.trans(k.to(q.dtype)), DOT_PREC) * qk_scale
    if keep is not None:
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_sub = m_new
    if keep is not None:  # exp2(-inf - -inf) is NaN: such a row subtracts 0, so alpha = p = 0 (finite rows unchanged)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_sub)
    p = tl.exp2(s - m_sub[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + attn_dot(p.to(q.dtype), v.to(q.dtype), DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def online_softmax_finish(m_i, l_i, acc):
    """The normalised output acc / l_i and the lse (natural log) of each row. A row that saw no key
    (l_i == 0) gets o = 0 and lse = -inf, never NaN, so an LSE merge ignores it."""
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) * _LN2, float("-inf"))
    return o, lse


@triton.jit
def fold_block_max(bm_ptr, q, k, qk_scale, keep, row, head, pos, stride_bmt, stride_bmh, BS: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    """A tile's scores, where keep [BLOCK_M, BLOCK_N], folded into block_max fp32 [T, Hq, W] at (query row,
    q head, pos // BS) by an atomic max (pacore_kernels/block_importance.py): a tile may span several
    blocks and a block several tiles or splits. The K tile is in registers: the scores again cost
    FLOPs, not bytes (decode reads bytes)."""
    s = attn_dot(q, tl.trans(k.to(q.dtype)), DOT_PREC) * qk_scale
    off = row.to(tl.int64)[:, None] * stride_bmt + head[:, None] * stride_bmh + (pos // BS)[None, :]
    tl.atomic_max(bm_ptr + off, s * _LN2, mask=keep)


@triton.jit
def attend_key_range(q, kc_ptr, vc_ptr, bt_row, t0, t1, h, d, stride_tok, qk_scale, BS: tl.constexpr,
                     D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, bm_ptr, bm_row, bm_head,
                     bm_ok, stride_bmt, stride_bmh, STORE_BM: tl.constexpr):
    """q [BLOCK_M, BLOCK_D] attends (no mask) to the keys [t0, t1) of kv head h of one sequence. Returns
    (o, lse) as online_softmax_finish: an empty range gives o = 0, lse = -inf. STORE_BM: each score is
    also folded into block_max at (bm_row, bm_head) (pacore_kernels/block_importance.py)."""
    m_i = tl.full([q.shape[0]], float("-inf"), tl.float32)  # running max (log2 domain)
    l_i = tl.zeros([q.shape[0]], tl.float32)                # running sum of exp2
    acc = tl.zeros(q.shape, tl.float32)
    for n0 in range(t0, t1, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < t1
        k, v = load_kv_tile(kc_ptr, vc_ptr, bt_row, pos, ok, h, d, stride_tok, BS, D)
        m_i, l_i, acc = online_softmax_tile(q, k, v, ok[None, :], qk_scale, m_i, l_i, acc, DOT_PREC)
        if STORE_BM:
            fold_block_max(bm_ptr, q, k, qk_scale, ok[None, :] & bm_ok[:, None], bm_row, bm_head, pos, stride_bmt,
                           stride_bmh, BS, DOT_PREC)
    return online_softmax_finish(m_i, l_i, acc)


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


def check_kv_scales(cache_dtype: torch.dtype, k_scale: float, v_scale: float) -> None:
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        check(isinstance(s, (int, float)) and not isinstance(s, bool) and 0 < s < float("inf"),
              f"{name} must be a positive finite number, got {s!r}")
    check(is_fp8(cache_dtype) or k_scale == v_scale == 1.0,
          f"k_scale/v_scale ({k_scale}, {v_scale}) apply to FP8 caches only; a {cache_dtype} cache takes 1.0")


def check_attn_dtypes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: float = 1.0,
                      v_scale: float = 1.0) -> None:
    """q in fp32/fp16/bf16; the caches in q's dtype or both in one FP8 format (then scaled)."""
    check(q.dtype in (torch.float32, torch.float16, torch.bfloat16), f"q: unsupported dtype {q.dtype}")
    check(k_cache.dtype == v_cache.dtype and (k_cache.dtype == q.dtype or is_fp8(k_cache.dtype)),
          f"q/k_cache/v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype} (caches take q's dtype "
          f"or one FP8 format)")
    check_kv_scales(k_cache.dtype, k_scale, v_scale)
    check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
          f"caches must be [N, bs, Hkv, D] and equal: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "k_cache/v_cache must be contiguous")
    Hq, D = q.shape[-2:]
    Hkv = k_cache.shape[2]
    check(k_cache.shape[3] == D, f"head_dim mismatch: q {D}, cache {k_cache.shape[3]}")
    check(Hq % Hkv == 0, f"num q heads {Hq} is not a multiple of num kv heads {Hkv}")
