"""Prefill / chunked-prefill attention over the paged KV cache (causal, packed varlen queries)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._utils import (HAS_TRITON, check, check_attn_dtypes, check_int, check_rows, check_same_device, gather_blocks,
                     is_fp8, load_kv_tile, next_pow2, online_softmax_finish, online_softmax_tile, require_triton, tl, triton)
from .paged_decode import _LOG2E, dot_precision, launch_opts

# Cap on fp32 score elements per step of the reference, so long prompts do not blow up memory.
_REF_MAX_SCORES = 1 << 25


def prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                          sm_scale: float, work_plans: dict | None = None, k: torch.Tensor | None = None,
                          v: torch.Tensor | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """q [Tq, Hq, D]; query i of sequence s sits at position seq_lens[s] - q_len_s + i and attends
    causally to cache positions 0..=that position. Returns out [Tq, Hq, D] in q.dtype. An FP8 cache is
    read as stored * k_scale / v_scale.

    work_plans, k and v (this chunk's keys and values, already stored in the cache) are hints of the
    Triton version, accepted here so both share one signature."""
    Tq, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    dev = q.device
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    ctx_lens = seq_lens.tolist()
    for s, ctx in enumerate(ctx_lens):
        q0, q1 = cu[s], cu[s + 1]
        n = q1 - q0
        if n <= 0:
            continue
        nb = (ctx + bs - 1) // bs
        blocks = block_tables[s, :nb].to(device=dev, dtype=torch.int64)
        k = gather_blocks(k_cache, blocks, k_scale)[:, None, :ctx].expand(Hkv, G, ctx, D)  # [Hkv, G, ctx, D]
        v = gather_blocks(v_cache, blocks, v_scale)[:, None, :ctx].expand(Hkv, G, ctx, D)
        qs = q[q0:q1].float().reshape(n, Hkv, G, D).permute(1, 2, 0, 3)               # [Hkv, G, n, D]
        if n == ctx:  # a whole prompt, nothing cached: the causal kernel needs no mask at all
            o = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=sm_scale)
            out[q0:q1] = o.permute(2, 0, 1, 3).reshape(n, Hq, D).to(q.dtype)
            continue
        qpos = torch.arange(ctx - n, ctx, device=dev)
        kpos = torch.arange(ctx, device=dev)
        step = max(1, _REF_MAX_SCORES // max(1, ctx))  # query rows per chunk bound the mask's size
        for c0 in range(0, n, step):
            c1 = min(n, c0 + step)
            keep = kpos[None, :] <= qpos[c0:c1, None]                                # causal
            # torch's fused CPU attention: exact softmax without materialising the scores.
            o = F.scaled_dot_product_attention(qs[:, :, c0:c1], k, v, attn_mask=keep, scale=sm_scale)
            out[q0 + c0:q0 + c1] = o.permute(2, 0, 1, 3).reshape(c1 - c0, Hq, D).to(q.dtype)
    return out


# --- Triton ---------------------------------------------------------------------------------------
# FlashAttention-style. One program per (query tile of one sequence, kv head): its M dim packs BLOCK_Q
# query positions x the kv head's QPK query heads, so each K/V tile is read once for the whole GQA group.
# Keys every query of the tile may see are walked without a mask; only the tiles on the causal diagonal
# are masked. Tiles of all sequences are laid out flat; the tile -> (sequence, tile index) map is built
# on the device once per step (work_plans), with no host sync. Keys are read through the block table.
#
# A chunk that is a whole prompt with nothing cached before it (every query sees exactly this chunk's
# keys) can instead go to torch's SDPA flash kernel (FlashAttention-2 inside PyTorch) on the chunk's own
# K/V: no paged reads at all. SDPA_WHOLE_PROMPTS picks that path when k/v are given. Not with an FP8
# cache: attention then reads what the cache holds, as the reference and any later chunk or recompute
# do, so a prompt's result does not depend on whether it came whole or in chunks.

SDPA_WHOLE_PROMPTS = True


@triton.jit(do_not_specialize=["stride_bt", "S"])
def _prefill_kernel(q_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, seq_ptr, tile_seq_ptr, tile_idx_ptr, o_ptr,
                    stride_qt, stride_ot, stride_bt, stride_tok, S, qk_scale, v_scale,
                    QPK: tl.constexpr, QPK_P2: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    BLOCK_Q: tl.constexpr = BLOCK_M // QPK_P2  # query positions per tile
    tile = tl.program_id(0)
    h = tl.program_id(1)                       # kv head
    s = tl.load(tile_seq_ptr + tile)
    if s >= S:  # the flat grid is an upper bound on the number of tiles
        return
    ti = tl.load(tile_idx_ptr + tile)
    q0 = tl.load(cu_ptr + s).to(tl.int64)
    qlen = (tl.load(cu_ptr + s + 1) - q0).to(tl.int32)
    ctx = tl.load(seq_ptr + s).to(tl.int32)

    r = tl.arange(0, BLOCK_M)
    i = ti * BLOCK_Q + r // QPK_P2             # query index within the chunk
    head = h * QPK + r % QPK_P2
    row_ok = (i < qlen) & (r % QPK_P2 < QPK)
    qpos = ctx - qlen + i                      # absolute position of each query
    d = tl.arange(0, BLOCK_D)
    q_off = (q0 + i)[:, None] * stride_qt + head[:, None] * D + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & (d[None, :] < D), other=0.0)

    first_q = ctx - qlen + ti * BLOCK_Q        # the tile's first query position
    kv_end = tl.minimum(ctx, first_q + BLOCK_Q)  # its last query sees keys < kv_end
    full_end = (first_q + 1) // BLOCK_N * BLOCK_N  # keys [0, full_end): whole tiles every query sees
    bt_row = bt_ptr + s.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, full_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        k, v = load_kv_tile(kc_ptr, vc_ptr, bt_row, pos, pos < full_end, h, d, stride_tok, BS, D)
        m_i, l_i, acc = online_softmax_tile(q, k, v, None, qk_scale, m_i, l_i, acc, DOT_PREC)
    for n0 in range(full_end, kv_end, BLOCK_N):  # the diagonal: causal mask
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < kv_end
        k, v = load_kv_tile(kc_ptr, vc_ptr, bt_row, pos, ok, h, d, stride_tok, BS, D)
        keep = ok[None, :] & (pos[None, :] <= qpos[:, None])
        # Key 0 is in the first tile walked and visible to every query: the max is finite from then on.
        m_i, l_i, acc = online_softmax_tile(q, k, v, keep, qk_scale, m_i, l_i, acc, DOT_PREC)
    o, _ = online_softmax_finish(m_i, l_i, acc)  # prefill writes the final output: no lse
    o_off = (q0 + i)[:, None] * stride_ot + head[:, None] * D + d[None, :]
    tl.store(o_ptr + o_off, (o * v_scale).to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (d[None, :] < D))


def _check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, k_scale=1.0, v_scale=1.0):
    check_rows("q", q, 3)
    check_attn_dtypes(q, k_cache, v_cache, k_scale, v_scale)
    check_int("cu_seqlens_q", cu_seqlens_q)
    check_int("seq_lens", seq_lens)
    S = seq_lens.shape[0]
    check(cu_seqlens_q.shape == (S + 1,), f"cu_seqlens_q must be [S + 1] = [{S + 1}], got {tuple(cu_seqlens_q.shape)}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == S and block_tables.stride(1) == 1
          and block_tables.dtype in (torch.int32, torch.int64),
          f"block_tables must be int32/int64 [S={S}, max_blocks] with contiguous rows")
    check(q.shape[-1] <= 256, f"head_dim {q.shape[-1]} > 256 is not supported")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                      cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens)


# The bf16/fp16 tile: (rows = query positions x padded q heads per kv head, keys, warps). On sm_90 (Triton
# 3.9) "128x64" compiles to 255 registers per thread with a little spilled to the stack: one 256-thread
# block per SM; "64x32" to 229 registers, no spill, two 128-thread blocks per SM. Which is faster is the
# GPU's to say: bench/gpu/kernels.py times every tile at 16k and 64k ("prefill" rows, tile=...), and the
# winner becomes PREFILL_TILE here in a commit that cites the row.
PREFILL_TILES = {"128x64": (128, 64, 8), "64x32": (64, 32, 4)}
PREFILL_TILE = "128x64"


def prefill_blocks(dtype: torch.dtype, qpk: int, D: int) -> tuple[int, int, int]:
    """(BLOCK_M rows = query positions x padded q heads per kv head, BLOCK_N keys, num_warps)."""
    if dtype == torch.float32:  # fp32 tiles are twice the bytes: smaller ones stay inside shared memory
        return max(64, next_pow2(qpk)), 64 if D <= 64 else 32, 4
    rows, keys, warps = PREFILL_TILES[PREFILL_TILE]
    return max(rows, next_pow2(qpk)), keys, warps


def prefill_tile_map(cu_seqlens_q: torch.Tensor, num_tokens: int, block_q: int):
    """(tile_seq, tile_idx, n_bound): the flat grid's tiles -> (sequence, query tile), on the device.
    tile_seq == S past the last real tile; n_bound >= sum_s ceil(qlen_s / block_q)."""
    S = cu_seqlens_q.shape[0] - 1
    qlens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)
    tiles = (qlens + block_q - 1) // block_q
    cum = torch.cumsum(tiles, 0)
    n_bound = -(-num_tokens // block_q) + S
    t = torch.arange(n_bound, device=cu_seqlens_q.device)
    tile_seq = torch.searchsorted(cum, t, right=True)
    tile_idx = t - (cum - tiles)[tile_seq.clamp(max=S - 1)]
    return tile_seq.to(torch.int32), tile_idx.to(torch.int32), n_bound


def _whole_prompts(cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor) -> list[int] | None:
    """The chunk's sequence boundaries when every sequence is a whole prompt (nothing cached before it),
    else None. One device read per step (callers cache it in work_plans)."""
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    return cu if all(cu[i + 1] - cu[i] == n for i, n in enumerate(lens)) else None


def prefill_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int], sm_scale: float) -> torch.Tensor | None:
    """Causal attention of whole prompts on their own K/V through torch SDPA. q [Tq, Hq, D], k/v [Tq, Hkv, D];
    cu: host sequence boundaries. On CUDA only the flash kernel is allowed (its GQA needs no repeated
    K/V, and the math fallback would materialise L x L scores): None where it cannot run, which
    includes every fp32 input (flash has no fp32 kernel), so fp32 prefill on CUDA is the Triton kernel's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if q.is_cuda and q.dtype not in (torch.float16, torch.bfloat16):
        return None
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    backends = [SDPBackend.FLASH_ATTENTION] if q.is_cuda else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    try:
        with sdpa_kernel(backends):
            for a, b in zip(cu[:-1], cu[1:]):
                if b > a:  # [1, H, L, D]: the fused kernels take 4-d inputs
                    o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None],
                                                       v[a:b].transpose(0, 1)[None], is_causal=True, scale=sm_scale,
                                                       enable_gqa=True)
                    out[a:b] = o[0].transpose(0, 1)
    except RuntimeError:  # "No available kernel": the caller runs the Triton kernel instead
        return None
    return out


def prefill_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                             sm_scale: float, work_plans: dict | None = None, k: torch.Tensor | None = None,
                             v: torch.Tensor | None = None, sdpa: bool | None = None, k_scale: float = 1.0,
                             v_scale: float = 1.0) -> torch.Tensor:
    """Triton chunked prefill over the paged cache; same contract as prefill_attention_ref.

    work_plans: a dict shared by the layers of one step; it keeps the tile map (and whether the chunk
    is whole prompts), so they are built once per step. k, v: this chunk's keys and values [Tq, Hkv, D];
    with them, a chunk of whole prompts runs torch SDPA instead (sdpa, default SDPA_WHOLE_PROMPTS),
    unless the cache is FP8 (read in registers, K scale folded into the score scale)."""
    require_triton()
    _check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, k_scale, v_scale)
    Tq, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    S = seq_lens.shape[0]
    if Tq == 0 or S == 0:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    plans = work_plans if work_plans is not None else {}
    if (SDPA_WHOLE_PROMPTS if sdpa is None else sdpa) and k is not None and v is not None \
            and not is_fp8(k_cache.dtype):
        if "prefill_whole" not in plans:
            plans["prefill_whole"] = _whole_prompts(cu_seqlens_q, seq_lens)
        if plans["prefill_whole"] is not None:
            out = prefill_sdpa(q, k, v, plans["prefill_whole"], sm_scale)
            if out is not None:
                return out
            plans["prefill_whole"] = None  # SDPA cannot run these inputs: the other layers skip it too
    qpk = Hq // Hkv
    block_m, block_n, warps = prefill_blocks(q.dtype, qpk, D)
    key = ("prefill_tiles", block_m // next_pow2(qpk))
    if key not in plans:
        plans[key] = prefill_tile_map(cu_seqlens_q, Tq, block_m // next_pow2(qpk))
    tile_seq, tile_idx, n_bound = plans[key]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _prefill_kernel[(n_bound, Hkv)](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, tile_seq, tile_idx, out, q.stride(0),
        out.stride(0), block_tables.stride(0), Hkv * D, S, float(sm_scale * _LOG2E * k_scale), float(v_scale), QPK=qpk, QPK_P2=next_pow2(qpk),
        D=D, BS=bs, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(D)),
        DOT_PREC=dot_precision(q.dtype), num_warps=warps, num_stages=launch_opts(q.dtype)["num_stages"])
    return out


if not HAS_TRITON:  # only the reference is offered where triton does not import
    del prefill_attention_triton
