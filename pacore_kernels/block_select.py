"""Query-aware block selection for sparse self-drafting (Quest, arXiv 2406.10774): which KV blocks a
draft step reads besides its sink and recent window.

State (``bounds``, one per layer): ``[2, num_blocks + 1, Hkv, D]``, the channel-wise min (``[0]``) and
max (``[1]``) of the keys each block holds, per KV head, in the model's dtype; the extra last block takes
padding writes (slot -1). ``update_key_bounds`` keeps it as blocks fill: a write at a block's offset 0
starts the block afresh, every write widens it (so keys a verify pass later overwrote still count: the
bound stays an upper bound, only looser). Bytes per block: 2 * Hkv * D * dtype, against the block's KV
2 * block_size * Hkv * D * kv dtype: 1/16 of a bf16 cache at block size 16, 1/8 of an FP8 one.

Score of a row's block n: sum over the query heads h of sum_d max(q_hd * min_nd, q_hd * max_nd), an
upper bound of each head's q.k over the block's keys, summed: one block set per row and layer, shared by
its heads, so the paged decode kernel reads it through a reduced block table unchanged. Candidates are
the blocks past the sink's ``sink_blocks`` and before the last ``recent_blocks`` (the window, the
current partial block included); the others score -inf.

Selection (``select_blocks``, plain torch, the same on both paths): a row whose blocks fit in
sink + top_k + recent keeps its table; a longer one gets [its sink blocks, its top_k candidates in
order, its recent blocks], a table of fixed width with its length cut to match. Fixed shapes, no host
reads: CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from ._utils import HAS_TRITON, check, check_int, check_same_device, next_pow2, require_triton, tl, triton


def allocate_key_bounds(num_layers: int, num_blocks: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype, device) -> torch.Tensor:
    """[num_layers, 2, num_blocks + 1, Hkv, D], zeros (a block is reset by its first write)."""
    return torch.zeros(num_layers, 2, num_blocks + 1, num_kv_heads, head_dim, dtype=dtype, device=device)


def update_key_bounds(bounds: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor, block_size: int) -> None:
    """Fold the new keys k [T, Hkv, D] stored at ``slot_mapping`` [T] into one layer's ``bounds``
    [2, N + 1, Hkv, D], in place; slots of -1 go to the padding block N."""
    pad = bounds.shape[1] - 1
    slots = slot_mapping.to(device=bounds.device, dtype=torch.int64)
    ok = slots >= 0
    blk = torch.where(ok, slots // block_size, pad)
    fresh = torch.where(ok & (slots % block_size == 0), blk, pad)
    bounds[0].index_fill_(0, fresh, float("inf"))
    bounds[1].index_fill_(0, fresh, float("-inf"))
    k = k.to(bounds.dtype)
    idx = blk[:, None, None].expand_as(k)
    bounds[0].scatter_reduce_(0, idx, k, "amin")
    bounds[1].scatter_reduce_(0, idx, k, "amax")


def _check(q, bounds, block_tables, seq_lens) -> None:
    check(q.dim() == 3 and bounds.dim() == 4 and bounds.shape[0] == 2 and q.shape[2] == bounds.shape[3],
          f"q [B, Hq, D] and bounds [2, N + 1, Hkv, D] expected, got {tuple(q.shape)} and {tuple(bounds.shape)}")
    check(q.shape[1] % bounds.shape[2] == 0, f"{q.shape[1]} query heads are not a multiple of {bounds.shape[2]} KV heads")
    check(block_tables.dim() == 2 and block_tables.shape[0] == q.shape[0] and seq_lens.shape == (q.shape[0],),
          f"block_tables [B, W] and seq_lens [B] for B = {q.shape[0]}, got {tuple(block_tables.shape)}, "
          f"{tuple(seq_lens.shape)}")
    check_int("block_tables", block_tables)
    check_int("seq_lens", seq_lens)
    check_same_device(q=q, bounds=bounds, block_tables=block_tables, seq_lens=seq_lens)


def block_scores_ref(q: torch.Tensor, bounds: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     block_size: int, sink_blocks: int, recent_blocks: int) -> torch.Tensor:
    """fp32 [B, W]: each candidate block's upper bound of q.k summed over the query heads; -inf elsewhere."""
    _check(q, bounds, block_tables, seq_lens)
    B, Hq, D = q.shape
    W, Hkv = block_tables.shape[1], bounds.shape[2]
    cand = candidates(W, seq_lens, block_size, sink_blocks, recent_blocks)
    blk = torch.where(cand, block_tables.long(), 0)
    lo, hi = bounds[0][blk].float(), bounds[1][blk].float()     # [B, W, Hkv, D]
    # max(q * lo, q * hi) summed over d is q+ . hi + q- . lo: two batched dots; head h reads KV head h // group
    qg = q.float().view(B, Hkv, Hq // Hkv, D)
    ub = torch.einsum("bwkd,bkgd->bwkg", hi, qg.clamp(min=0)) + torch.einsum("bwkd,bkgd->bwkg", lo, qg.clamp(max=0))
    return torch.where(cand, ub.sum((2, 3)), float("-inf"))


def candidates(width: int, seq_lens: torch.Tensor, block_size: int, sink_blocks: int,
               recent_blocks: int) -> torch.Tensor:
    """bool [B, width]: the block-table columns a selection may pick, those between a row's sink and recent blocks."""
    n = torch.arange(width, device=seq_lens.device)
    nb = (seq_lens.long() + block_size - 1) // block_size
    return (n[None, :] >= sink_blocks) & (n[None, :] < (nb - recent_blocks)[:, None])


def select_by_importance(importance: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                         block_size: int, sink_blocks: int, top_k: int, recent_blocks: int):
    """Verification-guided selection (speculative_config selection "verify"): the reduced (tables, lens)
    of select_blocks from the last verify pass's importance [B, >= W] (pacore_kernels/block_importance.py)
    instead of key bounds, plus (start_lens, sink_lens) int32 [B] for the paged decode kernel: a row whose
    importance is still the -1 of a row never verified reads its sink and recent blocks alone (its chosen
    columns are skipped); the others read their whole reduced table."""
    W = block_tables.shape[1]
    scores = torch.where(candidates(W, seq_lens, block_size, sink_blocks, recent_blocks),
                         importance[:, :W], float("-inf"))
    tables, lens = select_blocks(scores, block_tables, seq_lens, block_size, sink_blocks, top_k, recent_blocks)
    nb = (seq_lens.long() + block_size - 1) // block_size
    fresh = (nb > sink_blocks + top_k + recent_blocks) & ~(scores.amax(1) >= 0)
    start = torch.where(fresh, (sink_blocks + top_k) * block_size, 0).to(torch.int32)
    return tables, lens, start, torch.where(fresh, sink_blocks * block_size, 0).to(torch.int32)


def select_blocks(scores: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                  sink_blocks: int, top_k: int, recent_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 tables [B, sink + top_k + recent], int32 lens [B]) for the paged decode kernel: a row
    with more blocks than that reads its sink, its top_k scoring blocks (in order) and its recent ones."""
    B, W = block_tables.shape
    width = sink_blocks + top_k + recent_blocks
    dev = block_tables.device
    if top_k:
        padded = torch.cat([scores, scores.new_full((B, max(0, top_k - W)), float("-inf"))], 1)
        top = padded.topk(top_k, dim=1).indices.sort(dim=1).values
    else:
        top = torch.zeros(B, 0, dtype=torch.long, device=dev)
    lens = seq_lens.long()
    nb = (lens + block_size - 1) // block_size
    sparse = torch.cat([torch.arange(sink_blocks, device=dev).expand(B, -1), top,
                        (nb - recent_blocks)[:, None] + torch.arange(recent_blocks, device=dev)], 1)
    cut = nb > width
    idx = torch.where(cut[:, None], sparse, torch.arange(width, device=dev).expand(B, -1)).clamp(0, max(W - 1, 0))
    tables = block_tables.gather(1, idx).to(torch.int32) if W else block_tables.new_zeros(B, width)
    last = (lens - 1) % block_size + 1
    return tables, torch.where(cut, (width - 1) * block_size + last, lens).to(torch.int32)


def select_blocks_ref(q, bounds, block_tables, seq_lens, block_size: int, sink_blocks: int, top_k: int,
                      recent_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reduced (tables, lens) of a sparse draft step, scored in torch (the CPU path, the oracle)."""
    scores = block_scores_ref(q, bounds, block_tables, seq_lens, block_size, sink_blocks, recent_blocks)
    return select_blocks(scores, block_tables, seq_lens, block_size, sink_blocks, top_k, recent_blocks)


# --- Triton ---------------------------------------------------------------------------------------
@triton.jit
def _block_scores_kernel(q_ptr, lo_ptr, hi_ptr, bt_ptr, lens_ptr, out_ptr, stride_qb, stride_qh, stride_bt,
                         stride_out, W, HQ, GROUP, HKV, BS, SINK_B, RECENT_B,
                         D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program per (row, BLOCK_N blocks): each query head's bound against its KV head's min/max.
    b = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nb = (tl.load(lens_ptr + b) + BS - 1) // BS
    cand = (n >= SINK_B) & (n < nb - RECENT_B) & (n < W)
    blk = tl.load(bt_ptr + b * stride_bt + n, mask=cand, other=0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    m = cand[:, None] & dm[None, :]
    score = tl.zeros([BLOCK_N], dtype=tl.float32)
    for h in range(HQ):
        qv = tl.load(q_ptr + b * stride_qb + h * stride_qh + d, mask=dm, other=0.0).to(tl.float32)[None, :]
        off = (blk[:, None] * HKV + h // GROUP) * D + d[None, :]
        lo = tl.load(lo_ptr + off, mask=m, other=0.0).to(tl.float32)
        hi = tl.load(hi_ptr + off, mask=m, other=0.0).to(tl.float32)
        score += tl.sum(tl.maximum(qv * lo, qv * hi), axis=1)
    tl.store(out_ptr + b * stride_out + n, tl.where(cand, score, float("-inf")), mask=n < W)


BLOCK_N = 16


def block_scores_triton(q: torch.Tensor, bounds: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        block_size: int, sink_blocks: int, recent_blocks: int) -> torch.Tensor:
    """Same contract as block_scores_ref."""
    require_triton()
    _check(q, bounds, block_tables, seq_lens)
    check(q.stride(2) == 1 and bounds.is_contiguous() and block_tables.stride(1) == 1,
          "q's head_dim, bounds and block_tables' rows must be contiguous")
    check(q.dtype in (torch.float32, torch.float16, torch.bfloat16), f"q dtype {q.dtype}")
    B, Hq, D = q.shape
    W, Hkv = block_tables.shape[1], bounds.shape[2]
    out = torch.empty(B, W, dtype=torch.float32, device=q.device)
    if B and W:
        _block_scores_kernel[(B, triton.cdiv(W, BLOCK_N))](
            q, bounds[0], bounds[1], block_tables, seq_lens, out, q.stride(0), q.stride(1), block_tables.stride(0),
            out.stride(0), W, Hq, Hq // Hkv, Hkv, block_size, sink_blocks, recent_blocks,
            D=D, BLOCK_N=BLOCK_N, BLOCK_D=next_pow2(D), num_warps=4)
    return out


def select_blocks_triton(q, bounds, block_tables, seq_lens, block_size: int, sink_blocks: int, top_k: int,
                         recent_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as select_blocks_ref, the scores from the Triton kernel."""
    scores = block_scores_triton(q, bounds, block_tables, seq_lens, block_size, sink_blocks, recent_blocks)
    return select_blocks(scores, block_tables, seq_lens, block_size, sink_blocks, top_k, recent_blocks)


if not HAS_TRITON:  # only the reference is offered where triton does not import
    del block_scores_triton, select_blocks_triton
