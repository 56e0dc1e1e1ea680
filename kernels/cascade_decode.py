"""Cascade (prefix-shared) decode: shared prefix once per group + per-row suffix, merged by LSE."""
from __future__ import annotations

import torch

from ._utils import (HAS_TRITON, attend_key_range, check, check_int, gather_blocks, masked_softmax_attend,
                     merge_attn_states, next_pow2, require_triton, tl, triton)
from .paged_decode import (_LOG2E, check_decode_args, default_num_splits, dot_precision, launch_decode_splits,
                           launch_merge, launch_opts, paged_decode_ref)


def cascade_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor, group_starts: torch.Tensor,
                       group_prefix_lens: torch.Tensor, sm_scale: float,
                       max_group_size: int | None = None) -> torch.Tensor:
    """q [B, Hq, D]; groups per engine/kv_cache.py. Returns out [B, Hq, D] in q.dtype.

    max_group_size is a launch hint of the Triton version, accepted here so both share one signature."""
    B, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    dev = q.device
    starts = group_starts.tolist()
    plens = group_prefix_lens.tolist()
    sizes = torch.tensor([starts[g + 1] - starts[g] for g in range(len(plens))], device=dev)
    row_prefix = torch.repeat_interleave(group_prefix_lens.to(device=dev, dtype=torch.int64), sizes,
                                         output_size=B)

    # Stage 1: every query row of a group (members x q heads per kv head) against the prefix, once.
    o1 = torch.zeros(B, Hq, D, dtype=torch.float32, device=dev)
    lse1 = torch.full((B, Hq), float("-inf"), dtype=torch.float32, device=dev)
    qf = q.float()
    for g, plen in enumerate(plens):
        r0, r1 = starts[g], starts[g + 1]
        if plen <= 0 or r1 <= r0:
            continue
        blocks = block_tables[r0, : plen // bs].to(device=dev, dtype=torch.int64)
        kp = gather_blocks(k_cache, blocks)                                  # [Hkv, P, D]
        vp = gather_blocks(v_cache, blocks)
        n = r1 - r0
        qg = qf[r0:r1].reshape(n, Hkv, G, D).permute(1, 0, 2, 3).reshape(Hkv, n * G, D)
        scores = torch.matmul(qg, kp.transpose(1, 2)) * sm_scale                            # [Hkv, n*G, P]
        keep = torch.ones(1, 1, plen, dtype=torch.bool, device=dev)
        o, l = masked_softmax_attend(scores, keep, vp)
        o1[r0:r1] = o.reshape(Hkv, n, G, D).permute(1, 0, 2, 3).reshape(n, Hq, D)
        lse1[r0:r1] = l.reshape(Hkv, n, G).permute(1, 0, 2).reshape(n, Hq)

    # Stage 2: each row's own suffix [prefix_len, seq_len), then the exact merge.
    q2 = q if q.dtype == torch.float32 else qf
    o2, lse2 = paged_decode_ref(q2, k_cache, v_cache, block_tables, seq_lens, sm_scale,
                                start_lens=row_prefix, return_lse=True)
    out, _ = merge_attn_states(o1, lse1, o2.float(), lse2)
    return out.to(q.dtype)


# --- Triton ---------------------------------------------------------------------------------------
# Stage 1: one program per (group, member tile, kv head, prefix split). Its M dim packs MT members x QPK
# q heads, so each prefix K/V tile is read once for all of them (the point of cascade). Stage 2 is the
# paged decode split kernel over each row's suffix [prefix_len, seq_len). Both write partial states into
# one [B, Hq, S1 + S2, D] buffer that a single log-sum-exp merge reduces.

_MAX_BLOCK_M = 64  # rows of the prefix dot; larger groups are tiled over members


@triton.jit
def _cascade_prefix_kernel(q_ptr, kc_ptr, vc_ptr, bt_ptr, gs_ptr, gp_ptr, o_ptr, lse_ptr,
                           stride_qb, stride_bt, stride_tok, stride_ob, stride_oh, stride_os,
                           stride_lb, stride_lh, stride_ls, HKV, NUM_SPLITS, qk_scale,
                           QPK: tl.constexpr, MT: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                           DOT_PREC: tl.constexpr):
    g = tl.program_id(0)
    h = tl.program_id(2) % HKV
    split = tl.program_id(2) // HKV
    r0 = tl.load(gs_ptr + g).to(tl.int64)
    r1 = tl.load(gs_ptr + g + 1).to(tl.int64)
    plen = tl.load(gp_ptr + g).to(tl.int32)
    row_base = r0 + tl.program_id(1) * MT
    if row_base >= r1:  # this member tile is past the end of a smaller group
        return

    r = tl.arange(0, BLOCK_M)
    member = r // QPK
    head = h * QPK + r % QPK
    row = row_base + member
    row_ok = (member < MT) & (row < r1)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + row[:, None] * stride_qb + head[:, None] * D + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < D), other=0.0)

    chunk = tl.cdiv(tl.cdiv(plen, NUM_SPLITS), BLOCK_N) * BLOCK_N
    t0 = split * chunk
    t1 = tl.minimum(t0 + chunk, plen)
    bt_row = bt_ptr + r0 * stride_bt  # the prefix blocks: the group's first row, shared by all members
    # No prefix (plen 0) or an empty split: o = 0, lse = -inf, ignored by the merge.
    o, lse = attend_key_range(q, kc_ptr, vc_ptr, bt_row, t0, t1, h, d, stride_tok, qk_scale, BS, D, BLOCK_N,
                              DOT_PREC)
    tl.store(o_ptr + row[:, None] * stride_ob + head[:, None] * stride_oh + split * stride_os + d[None, :],
             o, mask=row_ok[:, None] & (d[None, :] < D))
    tl.store(lse_ptr + row * stride_lb + head * stride_lh + split * stride_ls, lse, mask=row_ok)


def _max_group_size(group_starts: torch.Tensor) -> int:
    """Largest group, read from the device (a sync: callers that know it pass max_group_size)."""
    return int((group_starts[1:] - group_starts[:-1]).max().item()) if group_starts.numel() > 1 else 0


def cascade_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor, group_starts: torch.Tensor,
                          group_prefix_lens: torch.Tensor, sm_scale: float, max_group_size: int | None = None,
                          num_splits: int | None = None, suffix_splits: int | None = None) -> torch.Tensor:
    """Triton cascade decode; same contract as cascade_decode_ref.

    Optional host ints avoid GPU->host syncs (and are required under CUDA-graph capture): max_group_size
    (an upper bound on the rows of any group; else read from group_starts), num_splits (prefix split count) and suffix_splits (default: heuristics from the block-table width).
    """
    require_triton()
    check_decode_args(q, k_cache, v_cache, block_tables, seq_lens)
    check_int("group_starts", group_starts)
    check_int("group_prefix_lens", group_prefix_lens)
    G = group_prefix_lens.shape[0]
    check(group_starts.shape == (G + 1,), f"group_starts must be [G + 1] = [{G + 1}], got {tuple(group_starts.shape)}")
    check(group_starts.device == q.device and group_prefix_lens.device == q.device, "group metadata on another device")
    B, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    qpk = Hq // Hkv
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if B == 0:
        return out
    if max_group_size is None:
        max_group_size = _max_group_size(group_starts)
    max_tokens = block_tables.shape[1] * bs
    block_m = max(16, next_pow2(qpk), min(_MAX_BLOCK_M, next_pow2(max_group_size * qpk)))
    mt = block_m // qpk
    m_tiles = max(1, -(-max_group_size // mt))
    s1 = num_splits or default_num_splits(q, max(1, G * m_tiles * Hkv), max_tokens)
    s2 = suffix_splits or default_num_splits(q, B * Hkv, max_tokens)
    check(s1 >= 1 and s2 >= 1, "split counts must be >= 1")

    o_part = torch.empty(B, Hq, s1 + s2, D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B, Hq, s1 + s2, dtype=torch.float32, device=q.device)
    if G > 0:
        _cascade_prefix_kernel[(G, m_tiles, Hkv * s1)](
            q, k_cache, v_cache, block_tables, group_starts, group_prefix_lens, o_part, lse_part,
            q.stride(0), block_tables.stride(0), Hkv * D, *o_part.stride()[:3], *lse_part.stride(),
            Hkv, s1, sm_scale * _LOG2E, QPK=qpk, MT=mt, D=D, BS=bs, BLOCK_M=block_m,
            BLOCK_N=64 if D <= 64 else 32, BLOCK_D=max(16, next_pow2(D)), DOT_PREC=dot_precision(q.dtype),
            **launch_opts(q.dtype))
    # Each row's suffix starts at its group's prefix length (sync-free: output_size is given).
    sizes = group_starts[1:] - group_starts[:-1]
    row_prefix = torch.repeat_interleave(group_prefix_lens, sizes, output_size=B)
    launch_decode_splits(q, k_cache, v_cache, block_tables, seq_lens, row_prefix, sm_scale,
                         o_part, lse_part, s1, s2)
    launch_merge(o_part, lse_part, out)
    return out

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del cascade_decode_triton
