"""Decode attention (one query token per sequence) over the paged KV cache."""
from __future__ import annotations

import torch

from ._utils import (HAS_TRITON, attend_key_range, check, check_attn_dtypes, check_int, check_rows,
                     check_same_device, fold_block_max, gather_blocks, load_kv_tile, masked_softmax_attend, next_pow2,
                     online_softmax_finish, online_softmax_tile, require_triton, tl, triton)
from .block_importance import finish_importance, fold_block_max_ref, new_block_max


def paged_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
                     start_lens: torch.Tensor | None = None, return_lse: bool = False,
                     k_scale: float = 1.0, v_scale: float = 1.0, cu_seqlens_q: torch.Tensor | None = None,
                     max_query_len: int | None = None, sink_lens: torch.Tensor | None = None,
                     importance: torch.Tensor | None = None, block_max: torch.Tensor | None = None):
    """Decode attention over the paged cache: row b's queries attend to its keys [start_lens[b], their
    own position], plus the keys [0, sink_lens[b]) when given (a sink before a window).

    One query per row: q [B, Hq, D] at position seq_lens[b] - 1. Several (speculative verification):
    q [T, Hq, D] packed by cu_seqlens_q int32 [B + 1]; query i of row b sits at position
    seq_lens[b] - q_len_b + i and sees keys up to it (causal among the row's new tokens).
    Returns out [T, Hq, D] (q.dtype), plus lse fp32 [T, Hq] when return_lse. Empty range: out 0, lse -inf.
    Caches in q's dtype, or FP8 read as stored * k_scale / v_scale (engine/worker/kv_cache.py).
    importance fp32 [B, W] (W = block_tables' width), when given, is filled with each block's verify
    importance (pacore_kernels/block_importance.py); block_max [T, Hq, W], when given, has the raw scores'
    per-block maxima folded in (cascade's suffix stage, which normalises after its merge).
    Vectorised: gathers each row's blocks once for all its queries (a window of W blocks; with a sink,
    the sink's blocks too). max_query_len is a launch hint of the Triton version.
    """
    if importance is not None:
        block_max = new_block_max(importance, q, block_tables)
        out, lse = paged_decode_ref(q, k_cache, v_cache, block_tables, seq_lens, sm_scale, start_lens, True, k_scale,
                                    v_scale, cu_seqlens_q, max_query_len, sink_lens, block_max=block_max)
        finish_importance(block_max, lse, cu_seqlens_q, importance)
        return (out, lse) if return_lse else out
    B = seq_lens.shape[0]
    T, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    dev = q.device
    seq = seq_lens.to(device=dev, dtype=torch.int64)
    start = torch.zeros_like(seq) if start_lens is None else start_lens.to(device=dev, dtype=torch.int64)
    start = torch.minimum(start, seq)
    sink = torch.zeros_like(seq) if sink_lens is None else torch.minimum(sink_lens.to(device=dev, dtype=torch.int64),
                                                                          start)
    if cu_seqlens_q is None:
        qlens = torch.ones_like(seq)
    else:
        qlens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(device=dev, dtype=torch.int64)
    Qm = int(qlens.max().item()) if B > 0 else 0
    n_q = int(qlens.sum().item())  # q may have padding rows after them (a graph's bucket): output 0
    lse = torch.full((T, Hq), float("-inf"), dtype=torch.float32, device=dev)
    out = torch.zeros_like(q)
    sink_blk = (sink + bs - 1) // bs
    first_blk = start // bs
    n_blk = (seq + bs - 1) // bs - first_blk
    Ws, W = (int(x.max().item()) if B > 0 else 0 for x in (sink_blk, n_blk))
    if W + Ws <= 0 or Qm == 0:
        return (out, lse) if return_lse else out

    # Block-table columns: the sink's first (masked past sink), then the window's [start, seq).
    cols = torch.cat([torch.arange(Ws, device=dev).expand(B, Ws), first_blk[:, None] + torch.arange(W, device=dev)], 1)
    in_sink = torch.arange(Ws + W, device=dev) < Ws
    cols_ok = torch.where(in_sink, cols < sink_blk[:, None], cols < ((seq + bs - 1) // bs)[:, None])  # no padding entries
    cols_c = torch.where(cols_ok, cols, torch.zeros_like(cols)).clamp_max(block_tables.shape[1] - 1)
    blocks = torch.gather(block_tables.to(device=dev, dtype=torch.int64), 1, cols_c)
    blocks = torch.where(cols_ok, blocks, torch.zeros_like(blocks))
    k = gather_blocks(k_cache, blocks, k_scale)  # [Hkv, B, L, D] fp32
    v = gather_blocks(v_cache, blocks, v_scale)
    L = (Ws + W) * bs
    pos = (cols[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(B, L)  # token positions
    part = in_sink.repeat_interleave(bs)[None, :]
    keep = torch.where(part, pos < sink[:, None], (pos >= start[:, None]) & (pos < seq[:, None]))
    keep &= cols_ok.repeat_interleave(bs, dim=1)
    v.masked_fill_(~keep[None, :, :, None], 0.0)  # masked slots may hold garbage (even NaN): 0 * NaN = NaN

    # Queries padded to [B, Qm]: query i of row b sees positions <= seq - q_len + i.
    i = torch.arange(Qm, device=dev)
    q_ok = i[None, :] < qlens[:, None]                                           # [B, Qm]
    qpos = seq[:, None] - qlens[:, None] + i[None, :]
    keep_q = keep[:, None, :] & (pos[:, None, :] <= qpos[:, :, None]) & q_ok[:, :, None]  # [B, Qm, L]
    if cu_seqlens_q is None:
        qp = q[:, None]
    else:
        qp = torch.zeros(B, Qm, Hq, D, dtype=q.dtype, device=dev)
        qp[q_ok] = q[:n_q]
    qf = qp.float().reshape(B, Qm, Hkv, G, D).permute(2, 0, 1, 3, 4).reshape(Hkv, B, Qm * G, D)
    scores = torch.matmul(qf, k.transpose(-1, -2)) * sm_scale                   # [Hkv, B, Qm*G, L]
    mask = keep_q[:, :, None, :].expand(B, Qm, G, L).reshape(1, B, Qm * G, L)
    o, l = masked_softmax_attend(scores, mask, v)
    if block_max is not None:
        s = scores.masked_fill(~mask, float("-inf")).reshape(Hkv, B, Qm, G, L).permute(1, 2, 0, 3, 4)
        fold_block_max_ref(block_max[:n_q], s[q_ok].reshape(n_q, Hq, L), cols_c[:, None].expand(B, Qm, -1)[q_ok], bs)
    o = o.reshape(Hkv, B, Qm, G, D).permute(1, 2, 0, 3, 4).reshape(B, Qm, Hq, D)
    l = l.reshape(Hkv, B, Qm, G).permute(1, 2, 0, 3).reshape(B, Qm, Hq)
    out[:n_q] = o[q_ok].to(q.dtype)
    lse[:n_q] = l[q_ok]
    return (out, lse) if return_lse else out


# --- Triton ---------------------------------------------------------------------------------------
# Flash-decoding: stage 1 splits each row's key range into NUM_SPLITS chunks; one program handles
# (row, kv head, split) with the q heads of that kv head packed into the M dim of tl.dot. Each writes a
# normalised partial output + its lse; stage 2 merges the splits by log-sum-exp. With one split, stage 1
# writes the final output directly.
# Several queries per row (HAS_CU): the M dim packs (query of the row) x (q heads of the kv head), so each
# K/V tile is read once for all of them. With a sink (HAS_SINK), a row's keys are the logical range
# [0, sink) ++ [start, seq), split evenly in that space and mapped to positions per tile lane.

_LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256
_MAX_SPLITS = 64
_MAX_QUERY_BLOCK_M = 64  # rows of the multi-query dot: a row's queries beyond it take another pass


@triton.jit
def _key_pos(j, sink, start, HAS_SINK: tl.constexpr):
    """Logical key index -> token position: [0, sink) is the sink, then the keys from start on."""
    if HAS_SINK:
        return tl.where(j < sink, j, j - sink + start)
    return j + start


@triton.jit
def _attend_queries(q_ptr, kc_ptr, vc_ptr, bt_row, o_ptr, lse_ptr, q0, q_len, seq, start, sink, h, sidx,
                    NUM_SPLITS, split, stride_qb, stride_tok, stride_ob, stride_oh, stride_os, stride_lb,
                    stride_lh, stride_ls, qk_scale, v_scale, QPK: tl.constexpr, QPK_P2: tl.constexpr,
                    D: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, HAS_SINK: tl.constexpr, STORE_LSE: tl.constexpr,
                    DOT_PREC: tl.constexpr, bm_ptr, stride_bmt, stride_bmh, STORE_BM: tl.constexpr):
    """Queries q0 .. q0 + q_len of one row (query i at position seq - q_len + i, causal) against this
    split's share of the row's logical keys, one pass per BLOCK_M // QPK_P2 queries."""
    QCH: tl.constexpr = BLOCK_M // QPK_P2  # queries per pass
    n_keys = sink + seq - start
    chunk = tl.cdiv(tl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N
    t0 = split * chunk
    t1 = tl.minimum(t0 + chunk, n_keys)
    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    head = h * QPK + r % QPK_P2
    head_ok = r % QPK_P2 < QPK
    for qc in range(0, q_len, QCH):
        i = qc + r // QPK_P2
        row_ok = head_ok & (i < q_len)
        qpos = seq - q_len + i
        q = tl.load(q_ptr + (q0 + i)[:, None] * stride_qb + head[:, None] * D + d[None, :],
                    mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
        # Logical keys [0, vis) are seen by every query of the pass (positions <= its first query's):
        # whole tiles of them are walked unmasked, the rest (the causal diagonal) masked.
        first = seq - q_len + qc
        vis = tl.maximum(tl.minimum(sink, first + 1), sink + first + 1 - start)
        full_end = t0 + (tl.maximum(tl.minimum(vis, t1), t0) - t0) // BLOCK_N * BLOCK_N  # >= t0, even if t1 < t0
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(t0, full_end, BLOCK_N):
            j = n0 + tl.arange(0, BLOCK_N)
            pos = _key_pos(j, sink, start, HAS_SINK)
            k, v = load_kv_tile(kc_ptr, vc_ptr, bt_row, pos, j < full_end, h, d, stride_tok, BS, D)
            m_i, l_i, acc = online_softmax_tile(q, k, v, None, qk_scale, m_i, l_i, acc, DOT_PREC)
            if STORE_BM:
                fold_block_max(bm_ptr, q, k, qk_scale, (j < full_end)[None, :] & row_ok[:, None], q0 + i, head, pos,
                               stride_bmt, stride_bmh, BS, DOT_PREC)
        for n0 in range(full_end, t1, BLOCK_N):
            j = n0 + tl.arange(0, BLOCK_N)
            ok = j < t1
            pos = _key_pos(j, sink, start, HAS_SINK)
            k, v = load_kv_tile(kc_ptr, vc_ptr, bt_row, pos, ok, h, d, stride_tok, BS, D)
            keep = ok[None, :] & (pos[None, :] <= qpos[:, None])
            # A query may see no key of this split at all: the softmax keeps it at l = 0 (o 0, lse -inf).
            m_i, l_i, acc = online_softmax_tile(q, k, v, keep, qk_scale, m_i, l_i, acc, DOT_PREC)
            if STORE_BM:
                fold_block_max(bm_ptr, q, k, qk_scale, keep & row_ok[:, None], q0 + i, head, pos, stride_bmt,
                               stride_bmh, BS, DOT_PREC)
        o, lse = online_softmax_finish(m_i, l_i, acc)
        row = q0 + i
        tl.store(o_ptr + row[:, None] * stride_ob + head[:, None] * stride_oh + sidx * stride_os + d[None, :],
                 (o * v_scale).to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (d[None, :] < D))
        if STORE_LSE:
            tl.store(lse_ptr + row * stride_lb + head * stride_lh + sidx * stride_ls, lse, mask=row_ok)


# Integers that change from call to call (split counts, table widths, strides over the split count) are
# not specialised on their value: each distinct ==1 / %16 pattern would be one more compile.
@triton.jit(do_not_specialize=["stride_bt", "stride_lb", "stride_lh", "stride_ls", "split_off", "NUM_SPLITS",
                               "stride_bmt", "stride_bmh"])
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_ptr, start_ptr, sink_ptr, cu_ptr, o_ptr, lse_ptr,
                         bm_ptr, stride_qb, stride_bt, stride_tok, stride_ob, stride_oh, stride_os,
                         stride_lb, stride_lh, stride_ls, stride_bmt, stride_bmh, split_off, NUM_SPLITS, qk_scale,
                         v_scale,
                         QPK: tl.constexpr, QPK_P2: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         HAS_START: tl.constexpr, HAS_CU: tl.constexpr, HAS_SINK: tl.constexpr,
                         STORE_LSE: tl.constexpr, DOT_PREC: tl.constexpr, STORE_BM: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(seq_ptr + b).to(tl.int32)
    start = 0
    if HAS_START:
        start = tl.minimum(tl.load(start_ptr + b).to(tl.int32), seq)
    sidx = split_off + split
    if HAS_CU or HAS_SINK:
        q0 = b
        q_len = 1
        if HAS_CU:
            q0 = tl.load(cu_ptr + b).to(tl.int64)
            q_len = (tl.load(cu_ptr + b + 1) - q0).to(tl.int32)
        sink = 0
        if HAS_SINK:
            sink = tl.minimum(tl.load(sink_ptr + b).to(tl.int32), start)
        _attend_queries(q_ptr, kc_ptr, vc_ptr, bt_ptr + b * stride_bt, o_ptr, lse_ptr, q0, q_len, seq, start,
                        sink, h, sidx, NUM_SPLITS, split, stride_qb, stride_tok, stride_ob, stride_oh, stride_os,
                        stride_lb, stride_lh, stride_ls, qk_scale, v_scale, QPK, QPK_P2, D, BS, BLOCK_M, BLOCK_N,
                        BLOCK_D, HAS_SINK, STORE_LSE, DOT_PREC, bm_ptr, stride_bmt, stride_bmh, STORE_BM)
    else:  # one query per row, keys [start, seq)
        # Split chunks are whole BLOCK_N tiles, sized from this row's own length: short rows leave later splits empty.
        chunk = tl.cdiv(tl.cdiv(seq - start, NUM_SPLITS), BLOCK_N) * BLOCK_N
        t0 = start + split * chunk
        t1 = tl.minimum(t0 + chunk, seq)

        m = tl.arange(0, BLOCK_M)               # q head within the kv head's group; rows >= QPK are padding
        d = tl.arange(0, BLOCK_D)
        head = h * QPK + m
        row_ok = m < QPK
        q = tl.load(q_ptr + b * stride_qb + head[:, None] * D + d[None, :],
                    mask=row_ok[:, None] & (d[None, :] < D), other=0.0)

        # An empty split (t0 >= t1) yields o = 0 and lse = -inf, which the merge ignores; never NaN.
        o, lse = attend_key_range(q, kc_ptr, vc_ptr, bt_ptr + b * stride_bt, t0, t1, h, d, stride_tok, qk_scale,
                                  BS, D, BLOCK_N, DOT_PREC, bm_ptr, b + m * 0, head, row_ok, stride_bmt, stride_bmh,
                                  STORE_BM)
        tl.store(o_ptr + b * stride_ob + head[:, None] * stride_oh + sidx * stride_os + d[None, :],
                 (o * v_scale).to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (d[None, :] < D))
        if STORE_LSE:
            tl.store(lse_ptr + b * stride_lb + head * stride_lh + sidx * stride_ls, lse, mask=row_ok)


@triton.jit(do_not_specialize=["S", "S1", "stride_lb", "stride_lh", "stride_fb"])
def _merge_splits_kernel(o_part_ptr, lse_part_ptr, out_ptr, lse_ptr, n1_ptr, S, S1, stride_pb, stride_ph, stride_ps,
                         stride_lb, stride_lh, stride_ob, stride_oh, stride_fb, D: tl.constexpr,
                         BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, STORE_LSE: tl.constexpr,
                         HAS_N1: tl.constexpr):
    # One program per (row, q head): exact log-sum-exp merge of S partial states. -inf parts weigh 0.
    # HAS_N1 (cascade): of the first S1 slots only the row's n1[b] prefix splits were written.
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    ok = s < S
    if HAS_N1:
        ok = ok & ((s < tl.load(n1_ptr + b)) | (s >= S1))
    lse = tl.load(lse_part_ptr + b * stride_lb + h * stride_lh + s, mask=ok, other=float("-inf"))
    mx = tl.max(lse, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp(lse - mx)
    den = tl.sum(w, 0)
    o = tl.load(o_part_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :],
                mask=ok[:, None] & (d[None, :] < D), other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < D)
    if STORE_LSE:
        tl.store(lse_ptr + b * stride_fb + h, tl.where(den > 0, mx + tl.log(tl.where(den > 0, den, 1.0)),
                                                       float("-inf")))


_SM_COUNT: dict = {}


def fill_target(device: torch.device) -> int:
    """Programs that keep the device busy: two per SM on CUDA (4 under the CPU interpreter)."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return 2 * _SM_COUNT[idx]


def default_num_splits(q: torch.Tensor, work_items: int, max_tokens: int) -> int:
    """Enough (row, head, split) programs to fill the GPU, but no split under ~256 tokens."""
    by_fill = -(-fill_target(q.device) // max(1, work_items))
    by_len = -(-max_tokens // MIN_TOKENS_PER_SPLIT)
    return max(1, min(by_fill, by_len, _MAX_SPLITS))


def dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 must not silently drop to tf32


def launch_opts(dtype: torch.dtype) -> dict:
    # fp32 tiles are twice the bytes: fewer pipeline stages keeps them inside shared memory.
    return dict(num_warps=4, num_stages=2 if dtype == torch.float32 else 3)


def check_decode_args(q, k_cache, v_cache, block_tables, seq_lens, start_lens=None, k_scale=1.0, v_scale=1.0,
                      cu_seqlens_q=None, max_query_len=None, sink_lens=None):
    check_rows("q", q, 3)
    check_attn_dtypes(q, k_cache, v_cache, k_scale, v_scale)
    check_int("seq_lens", seq_lens)
    check(seq_lens.dim() == 1, f"seq_lens must be [B], got {tuple(seq_lens.shape)}")
    B = seq_lens.shape[0]
    if cu_seqlens_q is None:
        check(q.shape[0] == B, f"q has {q.shape[0]} rows for {B} sequences: one query per row takes q [B, Hq, D] "
                               f"(several per row: pass cu_seqlens_q)")
    else:
        check_int("cu_seqlens_q", cu_seqlens_q)
        check(cu_seqlens_q.shape == (B + 1,),
              f"cu_seqlens_q must be [B + 1] = [{B + 1}] (B from seq_lens), got {tuple(cu_seqlens_q.shape)}")
    check(max_query_len is None or (isinstance(max_query_len, int) and not isinstance(max_query_len, bool)
                                    and max_query_len >= 1),
          f"max_query_len must be a host int >= 1 (the most queries of any row), got {max_query_len!r}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == B,
          f"block_tables must be [B, max_blocks] with B={B}, got {tuple(block_tables.shape)}")
    check(block_tables.dtype in (torch.int32, torch.int64) and block_tables.stride(1) == 1,
          "block_tables must be int32/int64 with contiguous rows")
    for name, t in (("start_lens", start_lens), ("sink_lens", sink_lens)):
        if t is not None:
            check_int(name, t)
            check(t.shape == (B,), f"{name} must be [B] = [{B}], got {tuple(t.shape)}")
    check(q.shape[-1] <= 256, f"head_dim {q.shape[-1]} > 256 is not supported")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                      start_lens=start_lens, cu_seqlens_q=cu_seqlens_q, sink_lens=sink_lens)


def resolve_max_query_len(cu_seqlens_q: torch.Tensor | None, max_query_len: int | None) -> int:
    """The largest queries per row: 1 without cu_seqlens_q; else the caller's hint, or read from the
    device (a sync: the engine passes it, and must under CUDA-graph capture)."""
    if cu_seqlens_q is None:
        return 1
    if max_query_len is None:
        n = cu_seqlens_q.shape[0] - 1
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item()) if n > 0 else 1
    return max(1, max_query_len)


def query_block_m(qpk: int, max_query_len: int) -> int:
    """Rows of the decode split kernel's dot: max_query_len queries x the kv head's q heads, each padded to
    a power of two, at most _MAX_QUERY_BLOCK_M (a row with more queries takes several passes)."""
    qpk2 = next_pow2(qpk)
    return max(16, min(next_pow2(max_query_len) * qpk2, max(_MAX_QUERY_BLOCK_M, qpk2)))


def launch_decode_splits(q, k_cache, v_cache, block_tables, seq_lens, start_lens, sm_scale,
                         o_buf, lse_buf, split_off, num_splits, store_lse=True, k_scale=1.0, v_scale=1.0,
                         cu_seqlens_q=None, max_query_len=1, sink_lens=None, block_max=None):
    """Stage 1 into o_buf/lse_buf: [T, Hq, S_total, D] / [T, Hq, S_total] (or the final [T, Hq, D] / [T, Hq]
    viewed with a zero split stride), T = the query rows. Used by paged decode and by cascade decode's
    suffix stage. An FP8 cache's K scale is folded into the score scale, its V scale into the output.
    block_max [T, Hq, W] fp32: each score also folded in by a max (pacore_kernels/block_importance.py)."""
    _, Hq, D = q.shape
    B = seq_lens.shape[0]
    _, bs, Hkv, _ = k_cache.shape
    qpk = Hq // Hkv
    if o_buf.dim() == 3:
        o_strides = (o_buf.stride(0), o_buf.stride(1), 0)
        l_strides = (lse_buf.stride(0), lse_buf.stride(1), 0) if lse_buf is not None else (0, 0, 0)
    else:
        o_strides = o_buf.stride()[:3]
        l_strides = lse_buf.stride()
    _decode_split_kernel[(B, Hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, start_lens if start_lens is not None else seq_lens,
        sink_lens if sink_lens is not None else seq_lens, cu_seqlens_q if cu_seqlens_q is not None else seq_lens,
        o_buf, lse_buf if lse_buf is not None else o_buf, block_max if block_max is not None else o_buf,
        q.stride(0), block_tables.stride(0), Hkv * D, *o_strides, *l_strides,
        *(block_max.stride()[:2] if block_max is not None else (0, 0)), split_off, num_splits,
        float(sm_scale * _LOG2E * k_scale), float(v_scale),
        QPK=qpk, QPK_P2=next_pow2(qpk), D=D, BS=bs, BLOCK_M=query_block_m(qpk, max_query_len),
        BLOCK_N=64 if D <= 64 else 32, BLOCK_D=max(16, next_pow2(D)), HAS_START=start_lens is not None,
        HAS_CU=cu_seqlens_q is not None, HAS_SINK=sink_lens is not None, STORE_LSE=store_lse,
        DOT_PREC=dot_precision(q.dtype), STORE_BM=block_max is not None, **launch_opts(q.dtype))


def launch_merge(o_part, lse_part, out, lse=None, prefix_splits=None, num_prefix_slots=0):
    """Merge [T, Hq, S, D] partial states into out, per query row. prefix_splits (int32 [T], cascade): query
    row t wrote only its first prefix_splits[t] of the num_prefix_slots prefix slots; the rest are never read."""
    T, Hq, S, D = o_part.shape
    # BLOCK_S >= 16: split counts up to 16 share one compiled merge (masked slots cost nothing).
    _merge_splits_kernel[(T, Hq)](
        o_part, lse_part, out, lse if lse is not None else lse_part,
        prefix_splits if prefix_splits is not None else lse_part, S, num_prefix_slots,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), lse_part.stride(0), lse_part.stride(1),
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        D=D, BLOCK_S=max(16, next_pow2(S)), BLOCK_D=max(16, next_pow2(D)), STORE_LSE=lse is not None,
        HAS_N1=prefix_splits is not None, num_warps=4)


def paged_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
                        start_lens: torch.Tensor | None = None, return_lse: bool = False,
                        num_splits: int | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                        cu_seqlens_q: torch.Tensor | None = None, max_query_len: int | None = None,
                        sink_lens: torch.Tensor | None = None, importance: torch.Tensor | None = None):
    """Triton paged decode; same contract as paged_decode_ref (importance: the verify importance, its
    scores folded in by each split and normalised after the merge). num_splits: split-KV count (default: a
    heuristic from the block-table width, so no host sync). An FP8 cache is upcast tile by tile in
    registers (fp32 accumulation), never dequantized in memory.

    Several queries per row (cu_seqlens_q): each K/V tile is read once for all of a row's queries.
    max_query_len bounds the queries of any row (host int, so no sync; without it the kernel reads it from
    the device); a row with more still gets exact results, in more passes over its keys."""
    require_triton()
    check_decode_args(q, k_cache, v_cache, block_tables, seq_lens, start_lens, k_scale, v_scale, cu_seqlens_q,
                      max_query_len, sink_lens)
    T, Hq, D = q.shape
    B = seq_lens.shape[0]
    Hkv = k_cache.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    want_lse = return_lse or importance is not None  # importance is normalised by the merged lse
    lse = torch.full((T, Hq), float("-inf"), dtype=torch.float32, device=q.device) if want_lse else None
    block_max = None if importance is None else new_block_max(importance, q, block_tables)
    if B > 0 and T > 0:
        qs = dict(cu_seqlens_q=cu_seqlens_q, max_query_len=resolve_max_query_len(cu_seqlens_q, max_query_len),
                  sink_lens=sink_lens, k_scale=k_scale, v_scale=v_scale, block_max=block_max)
        if num_splits is None:
            num_splits = default_num_splits(q, B * Hkv, block_tables.shape[1] * k_cache.shape[1])
        check(num_splits >= 1, "num_splits must be >= 1")
        if num_splits == 1:
            launch_decode_splits(q, k_cache, v_cache, block_tables, seq_lens, start_lens, sm_scale,
                                 out, lse, 0, 1, store_lse=want_lse, **qs)
        else:
            o_part = torch.empty(T, Hq, num_splits, D, dtype=torch.float32, device=q.device)
            lse_part = torch.empty(T, Hq, num_splits, dtype=torch.float32, device=q.device)
            launch_decode_splits(q, k_cache, v_cache, block_tables, seq_lens, start_lens, sm_scale,
                                 o_part, lse_part, 0, num_splits, **qs)
            launch_merge(o_part, lse_part, out, lse)
    if importance is not None:
        finish_importance(block_max, lse, cu_seqlens_q, importance)
    return (out, lse) if return_lse else out

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del paged_decode_triton
