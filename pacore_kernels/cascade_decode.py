"""Cascade (prefix-shared) decode: shared prefix once per group + per-row suffix, merged by LSE."""
from __future__ import annotations

import torch

from dataclasses import dataclass

from ._utils import (HAS_TRITON, attend_key_range, check, check_int, gather_blocks, masked_softmax_attend,
                     merge_attn_states, next_pow2, require_triton, tl, triton)
from .paged_decode import (_LOG2E, _MAX_SPLITS, MIN_TOKENS_PER_SPLIT, check_decode_args, default_num_splits,
                           dot_precision, fill_target, launch_decode_splits, launch_merge, launch_opts,
                           paged_decode_ref, resolve_max_query_len)
from .block_importance import finish_importance, fold_block_max_ref, new_block_max


def cascade_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor, group_starts: torch.Tensor,
                       group_prefix_lens: torch.Tensor, sm_scale: float,
                       max_group_size: int | None = None, work_plans: dict | None = None,
                       k_scale: float = 1.0, v_scale: float = 1.0, cu_seqlens_q: torch.Tensor | None = None,
                       max_query_len: int | None = None, importance: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D]: one query per row (T = B), or several packed by cu_seqlens_q as in paged_decode_ref
    (speculative verification: every query sits at or past its group's prefix, so it sees all of it);
    groups over the B rows
    per engine/worker/kv_cache.py. Returns out [T, Hq, D] in q.dtype. An FP8 cache is read as stored *
    k_scale / v_scale.

    importance fp32 [B, W], when given, is filled with each block's verify importance, prefix blocks
    included (pacore_kernels/block_importance.py).

    max_group_size, work_plans and max_query_len are launch hints of the Triton version, accepted here
    so both share one signature."""
    T, Hq, D = q.shape
    B = seq_lens.shape[0]
    _, bs, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    dev = q.device
    starts = group_starts.tolist()
    plens = group_prefix_lens.tolist()
    qrow = list(range(B + 1)) if cu_seqlens_q is None else cu_seqlens_q.tolist()  # row -> its first query
    sizes = torch.tensor([starts[g + 1] - starts[g] for g in range(len(plens))], device=dev)
    row_prefix = torch.repeat_interleave(group_prefix_lens.to(device=dev, dtype=torch.int64), sizes,
                                         output_size=B)

    # Stage 1: every query of a group (its rows' queries x q heads per kv head) against the prefix, once.
    o1 = torch.zeros(T, Hq, D, dtype=torch.float32, device=dev)
    lse1 = torch.full((T, Hq), float("-inf"), dtype=torch.float32, device=dev)
    qf = q.float()
    block_max = None if importance is None else new_block_max(importance, q, block_tables)
    for g, plen in enumerate(plens):
        r0, r1 = starts[g], starts[g + 1]
        t0, t1 = qrow[r0], qrow[r1]
        if plen <= 0 or t1 <= t0:
            continue
        blocks = block_tables[r0, : plen // bs].to(device=dev, dtype=torch.int64)
        kp = gather_blocks(k_cache, blocks, k_scale)                         # [Hkv, P, D]
        vp = gather_blocks(v_cache, blocks, v_scale)
        n = t1 - t0
        qg = qf[t0:t1].reshape(n, Hkv, G, D).permute(1, 0, 2, 3).reshape(Hkv, n * G, D)
        scores = torch.matmul(qg, kp.transpose(1, 2)) * sm_scale                            # [Hkv, n*G, P]
        keep = torch.ones(1, 1, plen, dtype=torch.bool, device=dev)
        o, l = masked_softmax_attend(scores, keep, vp)
        if block_max is not None:  # the prefix's blocks are the group's first row's columns 0 .. plen // bs
            s = scores.reshape(Hkv, n, G, plen).permute(1, 0, 2, 3).reshape(n, Hq, plen)
            fold_block_max_ref(block_max[t0:t1], s, torch.arange(plen // bs, device=dev).expand(n, -1), bs)
        o1[t0:t1] = o.reshape(Hkv, n, G, D).permute(1, 0, 2, 3).reshape(n, Hq, D)
        lse1[t0:t1] = l.reshape(Hkv, n, G).permute(1, 0, 2).reshape(n, Hq)

    # Stage 2: each row's own suffix [prefix_len, seq_len), causal among its queries, then the exact merge.
    q2 = q if q.dtype == torch.float32 else qf
    o2, lse2 = paged_decode_ref(q2, k_cache, v_cache, block_tables, seq_lens, sm_scale, start_lens=row_prefix,
                                return_lse=True, k_scale=k_scale, v_scale=v_scale, cu_seqlens_q=cu_seqlens_q,
                                block_max=block_max)
    out, lse = merge_attn_states(o1, lse1, o2.float(), lse2)
    if importance is not None:  # normalised by the merged lse: each stage's own is not the query's
        finish_importance(block_max, lse, cu_seqlens_q, importance)
    return out.to(q.dtype)


# --- Triton ---------------------------------------------------------------------------------------
# Stage 1 (prefix): work items are (group, member tile, kv head, prefix split); an item's M dim packs MT
# members x QPK q heads, so each prefix K/V tile is read once for all of them (the point of cascade). The
# members are the group's query rows: its rows' queries, one per row or several (cu_seqlens_q).
# The items are planned on the device from the real groups (cascade_prefix_plan), so a CUDA graph
# captured at a padded bucket splits a long prefix as finely as an eager call, and a fixed grid of
# about two programs per SM walks them (grid-stride): no empty programs per padding group.
# Stage 2 is the paged decode split kernel over each row's suffix [prefix_len, seq_len) (causal among a
# row's queries). Both write partial states into one [T, Hq, S1 + S2, D] buffer that a single log-sum-exp
# merge reduces per query row; a query row's unused prefix slots are skipped by the merge, never written.

_MAX_BLOCK_M = 64  # rows of the prefix dot; larger groups are tiled over members


@dataclass(slots=True)
class CascadePrefixPlan:
    """Stage 1's work, planned from the groups on the device (no host sync, the same under a graph).

    splits int32 [G]: prefix splits of group g (0: no prefix); query_splits int32 [T]: its query row's;
    row_prefix [B]: its row's prefix length (where the suffix starts); query_starts [G + 1]: group g's
    query rows are query_starts[g]:query_starts[g+1] (group_starts without cu_seqlens_q);
    cum_items int32 [G]: inclusive cumsum of the items (member tiles x kv heads x splits) of each group;
    max_splits: slots per query row in the partial buffer; num_programs: the fixed grid walking the items."""

    splits: torch.Tensor
    query_splits: torch.Tensor
    row_prefix: torch.Tensor
    query_starts: torch.Tensor
    cum_items: torch.Tensor
    members_per_tile: int
    block_m: int
    max_splits: int
    num_programs: int


def cascade_prefix_plan(group_starts: torch.Tensor, group_prefix_lens: torch.Tensor, num_rows: int,
                        num_q_heads: int, num_kv_heads: int, max_group_size: int, max_tokens: int,
                        target: int, block_n: int, cu_seqlens_q: torch.Tensor | None = None,
                        num_queries: int | None = None, max_query_len: int = 1) -> CascadePrefixPlan:
    """Split every group's prefix into chunks of one common length, >= MIN_TOKENS_PER_SPLIT and large
    enough that all items together number about `target` (programs that fill the device).

    max_group_size bounds a group's rows and max_query_len a row's queries (host ints: the tile size);
    cu_seqlens_q [B + 1] packs num_queries query rows (default: one per row)."""
    qpk = num_q_heads // num_kv_heads
    members = max(1, max_group_size) * max(1, max_query_len)
    block_m = max(16, next_pow2(qpk), min(_MAX_BLOCK_M, next_pow2(members * qpk)))
    mt = block_m // qpk
    # Each split of a group is >= work / target tokens long, so a group of one tile has at most
    # target / Hkv + 1 splits: that bounds the slots without reading the device.
    max_splits = max(1, min(_MAX_SPLITS, -(-target // num_kv_heads) + 1, -(-max_tokens // MIN_TOKENS_PER_SPLIT)))
    plen = group_prefix_lens.to(torch.int64)
    sizes = (group_starts[1:] - group_starts[:-1]).to(torch.int64)
    if cu_seqlens_q is None:
        query_starts, num_queries, qlens = group_starts, num_rows, None
    else:  # gathers on the device: sync-free
        query_starts = cu_seqlens_q[group_starts.long()]
        qlens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    nq = (query_starts[1:] - query_starts[:-1]).to(torch.int64)
    tiles = torch.where(plen > 0, (nq + mt - 1) // mt, 0)
    work = (tiles * plen).sum() * num_kv_heads                 # tokens x (tile, kv head) pairs
    chunk = torch.clamp_min((work + target - 1) // target, MIN_TOKENS_PER_SPLIT)
    chunk = (chunk + block_n - 1) // block_n * block_n
    splits = torch.where(tiles > 0, ((plen + chunk - 1) // chunk).clamp(1, max_splits), 0)
    cum = torch.cumsum(tiles * splits * num_kv_heads, 0).to(torch.int32)
    row_splits = torch.repeat_interleave(splits.to(torch.int32), sizes, output_size=num_rows)  # sync-free
    row_prefix = torch.repeat_interleave(group_prefix_lens, sizes, output_size=num_rows)
    query_splits = row_splits
    if qlens is not None:  # a graph's bucket may hold padding queries past cu[-1]: no prefix slots for them
        pad = (num_queries - cu_seqlens_q[-1:]).long()
        query_splits = torch.repeat_interleave(torch.cat([row_splits, row_splits.new_zeros(1)]),
                                               torch.cat([qlens.long(), pad]), output_size=num_queries)
    return CascadePrefixPlan(splits.to(torch.int32), query_splits, row_prefix, query_starts.to(torch.int32), cum,
                             mt, block_m, max_splits, target)


@triton.jit(do_not_specialize=["stride_bt", "stride_lb", "stride_lh", "stride_ls", "G", "NUM_PROGRAMS", "stride_bmt",
                               "stride_bmh"])
def _cascade_prefix_kernel(q_ptr, kc_ptr, vc_ptr, bt_ptr, gs_ptr, gq_ptr, gp_ptr, sp_ptr, cum_ptr, o_ptr, lse_ptr,
                           bm_ptr, stride_qb, stride_bt, stride_tok, stride_ob, stride_oh, stride_os,
                           stride_lb, stride_lh, stride_ls, stride_bmt, stride_bmh, G, HKV, NUM_PROGRAMS, qk_scale,
                           v_scale,
                           QPK: tl.constexpr, MT: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                           DOT_PREC: tl.constexpr, STORE_BM: tl.constexpr):
    r = tl.arange(0, BLOCK_M)
    member = r // QPK
    d = tl.arange(0, BLOCK_D)
    n_items = tl.load(cum_ptr + G - 1)
    for item in range(tl.program_id(0), n_items, NUM_PROGRAMS):
        lo = tl.full([], 0, tl.int32)  # the item's group: the first g with cum_items[g] > item
        hi = tl.full([], 0, tl.int32) + G
        while lo < hi:
            mid = (lo + hi) // 2
            if tl.load(cum_ptr + mid) <= item:
                lo = mid + 1
            else:
                hi = mid
        g = lo
        base = tl.load(cum_ptr + g - 1, mask=g > 0, other=0)
        r0 = tl.load(gs_ptr + g).to(tl.int64)  # the group's first row (its block table holds the prefix)
        t0 = tl.load(gq_ptr + g).to(tl.int64)  # the group's query rows [t0, t1)
        t1 = tl.load(gq_ptr + g + 1).to(tl.int64)
        plen = tl.load(gp_ptr + g).to(tl.int32)
        n_splits = tl.load(sp_ptr + g)
        n_tiles = tl.cdiv(t1 - t0, MT)
        rest = item - base  # tiles vary fastest: neighbouring programs read the same K/V tiles
        tile = rest % n_tiles
        h = (rest // n_tiles) % HKV
        split = (rest // n_tiles) // HKV

        row = t0 + tile * MT + member  # a query row
        head = h * QPK + r % QPK
        row_ok = (member < MT) & (row < t1)
        q = tl.load(q_ptr + row[:, None] * stride_qb + head[:, None] * D + d[None, :],
                    mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
        chunk = tl.cdiv(tl.cdiv(plen, n_splits), BLOCK_N) * BLOCK_N
        k0 = split * chunk
        k1 = tl.minimum(k0 + chunk, plen)
        bt_row = bt_ptr + r0 * stride_bt  # the prefix blocks: the group's first row, shared by all members
        o, lse = attend_key_range(q, kc_ptr, vc_ptr, bt_row, k0, k1, h, d, stride_tok, qk_scale, BS, D,
                                  BLOCK_N, DOT_PREC, bm_ptr, row, head, row_ok, stride_bmt, stride_bmh, STORE_BM)
        tl.store(o_ptr + row[:, None] * stride_ob + head[:, None] * stride_oh + split * stride_os + d[None, :],
                 o * v_scale, mask=row_ok[:, None] & (d[None, :] < D))
        tl.store(lse_ptr + row * stride_lb + head * stride_lh + split * stride_ls, lse, mask=row_ok)


def _max_group_size(group_starts: torch.Tensor) -> int:
    """Largest group, read from the device (a sync: callers that know it pass max_group_size)."""
    return int((group_starts[1:] - group_starts[:-1]).max().item()) if group_starts.numel() > 1 else 0


def _block_n(D: int) -> int:
    return 64 if D <= 64 else 32


def cascade_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor, group_starts: torch.Tensor,
                          group_prefix_lens: torch.Tensor, sm_scale: float, max_group_size: int | None = None,
                          work_plans: dict | None = None, suffix_splits: int | None = None,
                          num_programs: int | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                          cu_seqlens_q: torch.Tensor | None = None, max_query_len: int | None = None,
                          importance: torch.Tensor | None = None) -> torch.Tensor:
    """Triton cascade decode; same contract as cascade_decode_ref (importance: both stages fold their
    scores in, normalised by the merged lse).

    Optional host ints avoid GPU->host syncs (and are required under CUDA-graph capture): max_group_size
    (an upper bound on the rows of any group; else read from group_starts), max_query_len (with
    cu_seqlens_q: an upper bound on the queries of any row; else read from cu_seqlens_q) and
    suffix_splits (default: a heuristic from the block-table width). work_plans: a dict shared by the
    layers of one step, which keeps the prefix plan (it depends on the groups and cu_seqlens_q only) so
    it is built once per step. num_programs overrides the prefix grid (tests).
    """
    require_triton()
    check_decode_args(q, k_cache, v_cache, block_tables, seq_lens, k_scale=k_scale, v_scale=v_scale,
                      cu_seqlens_q=cu_seqlens_q, max_query_len=max_query_len)
    check_int("group_starts", group_starts)
    check_int("group_prefix_lens", group_prefix_lens)
    G = group_prefix_lens.shape[0]
    check(group_starts.shape == (G + 1,), f"group_starts must be [G + 1] = [{G + 1}], got {tuple(group_starts.shape)}")
    check(group_starts.device == q.device and group_prefix_lens.device == q.device, "group metadata on another device")
    T, Hq, D = q.shape
    B = seq_lens.shape[0]
    _, bs, Hkv, _ = k_cache.shape
    qpk = Hq // Hkv
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if B == 0 or T == 0:
        return out
    max_query_len = resolve_max_query_len(cu_seqlens_q, max_query_len)
    max_tokens = block_tables.shape[1] * bs
    plan = work_plans.get("cascade_prefix") if work_plans is not None else None
    if plan is None:
        if max_group_size is None:
            max_group_size = _max_group_size(group_starts)
        plan = cascade_prefix_plan(group_starts, group_prefix_lens, B, Hq, Hkv, max_group_size, max_tokens,
                                   num_programs or fill_target(q.device), _block_n(D), cu_seqlens_q=cu_seqlens_q,
                                   num_queries=T, max_query_len=max_query_len)
        if work_plans is not None:
            work_plans["cascade_prefix"] = plan
    s1 = plan.max_splits
    s2 = suffix_splits or default_num_splits(q, B * Hkv, max_tokens)
    check(s2 >= 1, "suffix_splits must be >= 1")

    o_part = torch.empty(T, Hq, s1 + s2, D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(T, Hq, s1 + s2, dtype=torch.float32, device=q.device)
    block_max = lse = None
    if importance is not None:
        block_max = new_block_max(importance, q, block_tables)
        lse = torch.empty(T, Hq, dtype=torch.float32, device=q.device)
    bm_strides = block_max.stride()[:2] if block_max is not None else (0, 0)
    if G > 0:
        _cascade_prefix_kernel[(plan.num_programs,)](
            q, k_cache, v_cache, block_tables, group_starts, plan.query_starts, group_prefix_lens, plan.splits,
            plan.cum_items, o_part, lse_part, block_max if block_max is not None else lse_part, q.stride(0),
            block_tables.stride(0), Hkv * D, *o_part.stride()[:3], *lse_part.stride(), *bm_strides, G, Hkv, plan.num_programs, float(sm_scale * _LOG2E * k_scale), float(v_scale),
            QPK=qpk, MT=plan.members_per_tile, D=D, BS=bs, BLOCK_M=plan.block_m, BLOCK_N=_block_n(D),
            BLOCK_D=max(16, next_pow2(D)), DOT_PREC=dot_precision(q.dtype), STORE_BM=block_max is not None,
            **launch_opts(q.dtype))
    launch_decode_splits(q, k_cache, v_cache, block_tables, seq_lens, plan.row_prefix, sm_scale,
                         o_part, lse_part, s1, s2, k_scale=k_scale, v_scale=v_scale, cu_seqlens_q=cu_seqlens_q,
                         max_query_len=max_query_len, block_max=block_max)
    launch_merge(o_part, lse_part, out, lse, prefix_splits=plan.query_splits, num_prefix_slots=s1)
    if importance is not None:
        finish_importance(block_max, lse, cu_seqlens_q, importance)
    return out

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del cascade_decode_triton
