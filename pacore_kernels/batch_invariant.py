"""Batch-invariant torch ops: a row's result depends on that row's inputs (and, for attention, on its
own sequence's keys), never on how many rows are computed with it or where it sits among them.

LLM(batch_invariant=True) runs the model on these, so a token's logits are the same bits whether it
is computed in a decode step, in a chunk of a prefill, or recomputed after a preemption or a resume.
What varies with the batch in the default path, and what is done here instead:

- GEMM: BLAS picks kernels and blocking by shape, so a row of x @ w.T changes with the number of
  rows (MKL on this repository's CPU: a row of the 576 x 49152 SmolLM2 head differs for M = 1..15
  vs 16). Within one shape every row is computed the same way wherever it sits, so linear layers
  run in ROW_TILE-row tiles, the last one zero-padded: every call has one shape.
- Attention: prefill (SDPA), decode (a gather padded to the batch's longest row) and cascade (two
  partial states merged) reduce over keys in different orders. attention_invariant computes every
  query token alike, over key tiles of K_TILE keys at fixed positions (0, K_TILE, ...): one row of
  a fixed-shape matmul per (query, tile), whatever other queries fill that matmul's Q_TILE slots
  (queries reading the same cache slots share one: a prefill chunk's queries, or fork siblings over
  their shared prompt, whose keys are then gathered once per Q_TILE siblings, as cascade does), in
  calls of BMM_ITEMS matmuls (cuBLAS also picks kernels by batch count), then sums over the query's
  own tiles by a fixed tree.
- Reductions that the library splits by shape (CUDA picks a reduction's layout from the number of
  outputs) are a fixed pairwise tree of elementwise adds (tree_sum): the same on any device.
  Maxima are exact in any order.
- Pointwise: F.silu's vectorised body and scalar tail disagree in the last bit on CPU (so a row's
  value depends on where a thread's chunk ends); silu is composed of ops whose two paths agree
  (neg, exp, add, div). RoPE, residual adds and the KV store are pointwise and exact already.

The cost: padded tiles (a decode's own key tile fills 1 of Q_TILE query slots; up to ROW_TILE - 1
padding rows per linear call), small GEMMs (a long prefill's linear layers run at about half the
speed of one large GEMM on CPU), keys copied per matmul, more and smaller calls; no Triton kernels
and no CUDA graphs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._utils import check, check_attn_dtypes

ROW_TILE = 16                # rows per linear-layer GEMM call
Q_TILE = 8                   # query tokens (of one sequence) per attention tile
K_TILE = 128                 # keys per attention tile, at absolute positions 0, K_TILE, ...
BMM_ITEMS = 16               # [Q_TILE * G, D] x [D, K_TILE] products per attention matmul call
CHUNK_ELEMENTS = 1 << 24     # bound on a chunk's fp32 scores / gathered keys


def _fixed_chunks(t: torch.Tensor, size: int) -> list[torch.Tensor]:
    """t split along dim 0 into chunks of `size`, the last zero-padded: one shape and one layout."""
    t = t.contiguous()
    parts = list(t.split(size))
    short = size - parts[-1].shape[0]
    if short:
        parts[-1] = torch.cat([parts[-1], parts[-1].new_zeros(short, *t.shape[1:])])
    return parts


def linear_invariant(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear of x [T, in] computed in ROW_TILE-row tiles, so each row is independent of T."""
    if x.shape[0] == 0:
        return F.linear(x, weight, bias)
    out = torch.cat([F.linear(tile, weight, bias) for tile in _fixed_chunks(x, ROW_TILE)])
    return out[: x.shape[0]]


def tree_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over dim by a fixed pairwise tree, zero-padded to a power of two: so trailing zeros, however
    many, do not change the result (a level adding zeros to its first half returns that half)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    width = 1 << max(0, n - 1).bit_length()
    if width != n:
        x = F.pad(x, (0, 0) * (x.dim() - 1 - dim) + (0, width - n))
    while width > 1:
        width //= 2
        x = x.narrow(dim, 0, width) + x.narrow(dim, width, width)
    return x.squeeze(dim)


def rmsnorm_invariant(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """rmsnorm_ref's contract and roundings, with the mean of squares summed by tree_sum."""
    dtype = x.dtype
    if residual is not None:
        x = x + residual
    h = x.float()
    n = h.shape[-1]
    pow2 = n & -n  # the squares as [n / pow2, pow2]: a tree over each row, then over their sums (no padding copy)
    h = h * torch.rsqrt(tree_sum(tree_sum((h * h).unflatten(-1, (n // pow2, pow2)))) / n + eps).unsqueeze(-1)
    out = (weight * h.to(dtype)).to(dtype)
    return out if residual is None else (out, x)


def silu_and_mul_invariant(x: torch.Tensor) -> torch.Tensor:
    """[gate | up] -> silu(gate) * up, silu as gate / (1 + exp(-gate)) in fp32, rounded to x's dtype."""
    i = x.shape[-1] // 2
    g = x[..., :i].float()
    return (g / (1 + torch.exp(-g))).to(x.dtype) * x[..., i:]


def _items(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t (any layout, read in its logical order) as [N, rows, cols] matrices in a contiguous fp32
    buffer, N rounded up to whole BMM_ITEMS-sized calls with zero matrices: every matmul call then
    has one shape and one layout."""
    n = t.numel() // (rows * cols)
    buf = torch.empty(-(-n // BMM_ITEMS) * BMM_ITEMS, rows, cols, dtype=torch.float32, device=t.device)
    buf[:n].view(t.shape).copy_(t)
    buf[n:].zero_()
    return buf


def _tile_items(cache: torch.Tensor, c: AttentionChunk, scale: float = 1.0) -> torch.Tensor:
    """Each item's [K_TILE, D] keys (or values) per kv head, as _items lays them out: the distinct
    tiles are gathered once (an FP8 cache dequantized: times its scale, elementwise, so still
    batch-invariant), then copied whole to the items that share them."""
    U, (_, Hkv, D), I = c.tile_slots.shape[0], cache.shape, c.item_tile.shape[0]
    tiles = torch.empty(U, Hkv, K_TILE, D, dtype=torch.float32, device=cache.device)
    tiles.copy_(cache.index_select(0, c.tile_slots.flatten()).view(U, K_TILE, Hkv, D).permute(0, 2, 1, 3))
    if scale != 1.0:
        tiles.mul_(scale)
    buf = torch.empty(-(-I * Hkv // BMM_ITEMS) * BMM_ITEMS, K_TILE, D, dtype=torch.float32, device=cache.device)
    torch.index_select(tiles, 0, c.item_tile, out=buf[:I * Hkv].view(I, Hkv, K_TILE, D))
    buf[I * Hkv:].zero_()
    return buf


def _item_bmm(a: torch.Tensor, b: torch.Tensor, transpose_b: bool = False) -> torch.Tensor:
    """a [N, M, K] @ b [N, K, P] (or b^T for b [N, P, K]), buffers from _items, BMM_ITEMS per call."""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[1] if transpose_b else b.shape[2])
    for i in range(0, a.shape[0], BMM_ITEMS):
        y = b[i:i + BMM_ITEMS]
        torch.bmm(a[i:i + BMM_ITEMS], y.transpose(1, 2) if transpose_b else y, out=out[i:i + BMM_ITEMS])
    return out


@dataclass(slots=True)
class AttentionChunk:
    """Index plan of one chunk of queries, the same for every layer of a step.

    A pair is (query, key tile j < its tile count); pairs that read the same cache slots share an
    item: one [Q_TILE * G, D] x [D, K_TILE] product per kv head, a query per Q_TILE slot."""
    queries: torch.Tensor     # [Qc] packed rows of q
    pair_q: torch.Tensor      # [P] the pair's query (index into queries)
    pair_j: torch.Tensor      # [P] its key tile
    pair_item: torch.Tensor   # [P] the item computing it
    pair_slot: torch.Tensor   # [P] and its query slot there
    tile_slots: torch.Tensor  # [U, K_TILE] cache slots of each distinct key tile
    item_tile: torch.Tensor   # [I] the key tile of each item
    item_q: torch.Tensor      # [I, Q_TILE] query of each slot (Qc: padding)
    keep: torch.Tensor        # [I, Q_TILE, K_TILE] key visible to the slot's query (causal)
    max_tiles: int


def plan_attention(cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                   block_size: int, max_pairs: int) -> list[AttentionChunk]:
    """Chunks of consecutive queries with at most max_pairs (query, key tile) pairs each (>= 1 query)."""
    dev = block_tables.device
    cu, ctx = cu_seqlens_q.to(dev, torch.int64), seq_lens.to(dev, torch.int64)
    tables = block_tables.to(dev, torch.int64)
    q_lens = cu[1:] - cu[:-1]
    Tq = int(cu[-1])
    seq = torch.repeat_interleave(torch.arange(len(q_lens), device=dev), q_lens, output_size=Tq)
    pos = ctx[seq] - cu[1:][seq] + torch.arange(Tq, device=dev)  # query t of s sits at ctx - (cu[s+1] - t)
    n_tiles = pos // K_TILE + 1
    # Keys past a sequence's end read its last key instead (written, so finite); they are masked.
    last = ctx - 1
    last_slot = tables.gather(1, (last // block_size)[:, None])[:, 0] * block_size + last % block_size
    chunks, a, counts = [], 0, n_tiles.tolist()
    while a < Tq:
        b, pairs = a + 1, counts[a]
        while b < Tq and pairs + counts[b] <= max_pairs:
            pairs += counts[b]
            b += 1
        chunks.append(_plan_chunk(a, b, seq, pos, n_tiles, ctx, tables, last_slot, block_size))
        a = b
    return chunks


def _plan_chunk(a, b, seq, pos, n_tiles, ctx, tables, last_slot, bs) -> AttentionChunk:
    dev = seq.device
    nt = n_tiles[a:b]
    Qc, P = b - a, int(nt.sum())
    pair_q = torch.repeat_interleave(torch.arange(Qc, device=dev), nt, output_size=P)
    pair_j = torch.arange(P, device=dev) - (torch.cumsum(nt, 0) - nt)[pair_q]
    s = seq[a:b][pair_q]
    kpos = pair_j[:, None] * K_TILE + torch.arange(K_TILE, device=dev)
    cols = (kpos // bs).clamp(max=tables.shape[1] - 1)
    slots = torch.where(kpos < ctx[s, None], tables[s[:, None], cols] * bs + kpos % bs, last_slot[s, None])
    uniq, group = torch.unique(torch.cat([pair_j[:, None], slots], 1), dim=0, return_inverse=True)
    sizes = torch.bincount(group, minlength=uniq.shape[0])
    items = (sizes + Q_TILE - 1) // Q_TILE
    order = torch.argsort(group, stable=True)
    g = group[order]
    rank = torch.arange(P, device=dev) - (torch.cumsum(sizes, 0) - sizes)[g]
    pair_item, pair_slot = torch.empty_like(pair_q), torch.empty_like(pair_q)
    pair_item[order] = (torch.cumsum(items, 0) - items)[g] + rank // Q_TILE
    pair_slot[order] = rank % Q_TILE
    I = int(items.sum())
    item_group = torch.repeat_interleave(torch.arange(uniq.shape[0], device=dev), items, output_size=I)
    item_q = torch.full((I, Q_TILE), Qc, dtype=torch.int64, device=dev)
    item_q[pair_item, pair_slot] = pair_q
    qpos = torch.cat([pos[a:b], pos.new_full((1,), 1 << 62)])  # padding slots see every key
    item_kpos = uniq[item_group, :1] * K_TILE + torch.arange(K_TILE, device=dev)
    keep = item_kpos[:, None, :] <= qpos[item_q][:, :, None]
    return AttentionChunk(torch.arange(a, b, device=dev), pair_q, pair_j, pair_item, pair_slot,
                          uniq[:, 1:], item_group, item_q, keep, int(nt.max()))


def attention_invariant(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                        sm_scale: float, plan: list[AttentionChunk] | None = None, k_scale: float = 1.0,
                        v_scale: float = 1.0) -> torch.Tensor:
    """prefill_attention_ref's contract (packed causal queries over the paged cache; a decode is a
    one-query sequence), with each query's result independent of the other queries and sequences.

    A query at position p reads key tiles j = 0 .. p // K_TILE: scores by one fixed-shape matmul
    row per tile (whichever queries share the item), the softmax over all its tiles at once (the max
    is exact in any order), weights summed per tile and then across tiles by tree_sum, the same for
    P @ V. Masked keys add exact zeros, and tiles past a query's own hold zeros, which leave every
    sum unchanged. plan: plan_attention's result for these arguments (layers of a step share it).
    An FP8 cache is read as stored * k_scale / v_scale.
    """
    check_attn_dtypes(q, k_cache, v_cache, k_scale, v_scale)
    check(cu_seqlens_q.numel() == seq_lens.numel() + 1, "cu_seqlens_q must have one more entry than seq_lens")
    Tq, Hq, D = q.shape
    _, bs, Hkv, _ = k_cache.shape
    if Tq == 0:
        return torch.empty_like(q)
    if plan is None:
        plan = plan_attention(cu_seqlens_q, seq_lens, block_tables, bs, max_pairs(Hq, Hkv, D))
    qf = torch.cat([q.float(), q.new_zeros(1, Hq, D, dtype=torch.float32)])  # row Tq: padding
    out = torch.empty_like(q)
    for c in plan:
        out[c.queries] = _attend_chunk(qf, k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D), c,
                                       sm_scale, k_scale, v_scale).to(q.dtype)
    return out


def max_pairs(num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    """Pairs per chunk, so that no fp32 buffer of a chunk exceeds CHUNK_ELEMENTS."""
    rows = Q_TILE * num_heads // num_kv_heads
    return max(1, CHUNK_ELEMENTS // (num_kv_heads * K_TILE * max(rows, head_dim)))


def _attend_chunk(qf: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, c: AttentionChunk,
                  sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    Hq, D = qf.shape[1:]
    Hkv = k_flat.shape[1]
    G, (I, Qc), n = Hq // Hkv, (c.item_q.shape[0], c.queries.shape[0]), c.item_q.shape[0] * k_flat.shape[1]
    rows = torch.cat([c.queries, c.queries.new_full((1,), qf.shape[0] - 1)])[c.item_q]   # [I, Q_TILE]
    qi = _items(qf[rows].view(I, Q_TILE, Hkv, G, D).permute(0, 2, 1, 3, 4), Q_TILE * G, D)  # (item, kv head)
    k, v = _tile_items(k_flat, c, k_scale), _tile_items(v_flat, c, v_scale)
    s = _item_bmm(qi, k, transpose_b=True)
    s5 = s[:n].view(I, Hkv, Q_TILE, G, K_TILE).mul_(sm_scale)
    s5.masked_fill_(~c.keep[:, None, :, None, :], float("-inf"))
    # Each query's max over all its tiles (exact in any order); every pair sees >= 1 key.
    tiles = 1 << max(0, c.max_tiles - 1).bit_length()                  # tree_sum needs no padding
    m_tab = s5.new_full((Qc + 1, tiles, Hkv, G), float("-inf"))
    m_tab[c.pair_q, c.pair_j] = s5.amax(dim=-1)[c.pair_item, :, c.pair_slot]
    m = m_tab.amax(dim=1)
    m[Qc] = 0                                                          # padding slots: finite
    p = torch.zeros_like(s)                                            # padding items stay 0
    p5 = torch.exp(s5 - m[c.item_q].permute(0, 2, 1, 3).unsqueeze(-1), out=p[:n].view_as(s5))
    pv = _item_bmm(p, v)[:n].view(I, Hkv, Q_TILE, G, D)
    l_tab = s5.new_zeros(Qc, tiles, Hkv, G)
    l_tab[c.pair_q, c.pair_j] = tree_sum(p5)[c.pair_item, :, c.pair_slot]
    pv_tab = s5.new_zeros(Qc, tiles, Hkv, G, D)
    pv_tab[c.pair_q, c.pair_j] = pv[c.pair_item, :, c.pair_slot]
    out = tree_sum(pv_tab, dim=1) / tree_sum(l_tab, dim=1).unsqueeze(-1)
    return out.reshape(Qc, Hq, D)
