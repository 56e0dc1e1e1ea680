"""Prefill / chunked-prefill attention over the paged KV cache (causal, packed varlen queries)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._utils import (HAS_TRITON, check, check_attn_dtypes, check_int, check_rows, check_same_device, gather_blocks,
                     load_kv_tile, next_pow2, online_softmax_finish, online_softmax_tile, require_triton, tl, triton)
from .paged_decode import _LOG2E, dot_precision, launch_opts

# Cap on fp32 score elements per step of the reference, so long prompts do not blow up memory.
_REF_MAX_SCORES = 1 << 25


def prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                          sm_scale: float) -> torch.Tensor:
    """q [Tq, Hq, D]; query i of sequence s sits at position seq_lens[s] - q_len_s + i and attends
    causally to cache positions 0..=that position. Returns out [Tq, Hq, D] in q.dtype."""
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
        k = gather_blocks(k_cache, blocks)[:, None, :ctx].expand(Hkv, G, ctx, D)      # [Hkv, G, ctx, D]
        v = gather_blocks(v_cache, blocks)[:, None, :ctx].expand(Hkv, G, ctx, D)
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
# One program per (query tile of one sequence, q head). Tiles of all sequences are laid out flat; the
# tile -> (sequence, tile index) map is built on the device with torch ops, so there is no host sync.
# Keys are read through the block table per token, up to the tile's last query position (causal).


@triton.jit(do_not_specialize=["stride_bt", "S"])
def _prefill_kernel(q_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, seq_ptr, tile_seq_ptr, tile_idx_ptr, o_ptr,
                    stride_qt, stride_ot, stride_bt, stride_tok, S, qk_scale,
                    QPK: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    tile = tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // QPK
    s = tl.load(tile_seq_ptr + tile)
    if s >= S:  # the flat grid is an upper bound on the number of tiles
        return
    ti = tl.load(tile_idx_ptr + tile)
    q0 = tl.load(cu_ptr + s).to(tl.int64)
    qlen = (tl.load(cu_ptr + s + 1) - q0).to(tl.int32)
    ctx = tl.load(seq_ptr + s).to(tl.int32)

    i = ti * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = i < qlen
    qpos = ctx - qlen + i                          # absolute position of each query
    d = tl.arange(0, BLOCK_D)
    q_off = (q0 + i)[:, None] * stride_qt + hq * D + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & (d[None, :] < D), other=0.0)

    kv_end = tl.minimum(ctx, ctx - qlen + (ti + 1) * BLOCK_M)  # last query of the tile sees < kv_end
    bt_row = bt_ptr + s.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, kv_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < kv_end
        k, v = load_kv_tile(kc_ptr, vc_ptr, bt_row, pos, ok, h, d, stride_tok, BS, D)
        keep = ok[None, :] & (pos[None, :] <= qpos[:, None])  # causal
        # Key 0 is in the first tile and visible to every query, so the max is finite from then on.
        m_i, l_i, acc = online_softmax_tile(q, k, v, keep, qk_scale, m_i, l_i, acc, DOT_PREC)
    o, _ = online_softmax_finish(m_i, l_i, acc)  # prefill writes the final output: no lse
    o_off = (q0 + i)[:, None] * stride_ot + hq * D + d[None, :]
    tl.store(o_ptr + o_off, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (d[None, :] < D))


def _check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens):
    check_rows("q", q, 3)
    check_attn_dtypes(q, k_cache, v_cache)
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


def prefill_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                             sm_scale: float) -> torch.Tensor:
    """Triton chunked prefill over the paged cache; same contract as prefill_attention_ref."""
    require_triton()
    _check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens)
    Tq, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    S = seq_lens.shape[0]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if Tq == 0 or S == 0:
        return out
    block_m = 64
    qlens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)
    tiles = (qlens + block_m - 1) // block_m
    cum = torch.cumsum(tiles, 0)
    n_bound = -(-Tq // block_m) + S                # >= sum_s ceil(qlen_s / BLOCK_M)
    t = torch.arange(n_bound, device=q.device)
    tile_seq = torch.searchsorted(cum, t, right=True)   # == S past the last real tile
    tile_idx = t - (cum - tiles)[tile_seq.clamp(max=S - 1)]
    _prefill_kernel[(n_bound, Hq)](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, tile_seq.to(torch.int32),
        tile_idx.to(torch.int32), out, q.stride(0), out.stride(0), block_tables.stride(0), Hkv * D, S,
        sm_scale * _LOG2E, QPK=Hq // Hkv, D=D, BS=bs, BLOCK_M=block_m, BLOCK_N=64 if D <= 64 else 32,
        BLOCK_D=max(16, next_pow2(D)), DOT_PREC=dot_precision(q.dtype), **launch_opts(q.dtype))
    return out


if not HAS_TRITON:  # only the reference is offered where triton does not import
    del prefill_attention_triton
