"""The paged KV cache: its memory layout and the batch metadata every attention path reads.

This docstring is the one place the layout is written down; `pacore_kernels/` and `engine/` both follow it.

Storage
-------
One preallocated tensor for the whole model::

    kv = torch.empty(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = kv[layer, 0], kv[layer, 1]      # each [num_blocks, block_size, Hkv, D], contiguous

A token's *slot* is ``block_id * block_size + offset``; ``k_cache.view(-1, Hkv, D)[slot]`` is its key.
``slot_mapping`` entries of -1 mean "do not store" (padding). Block ids, slots and every offset
derived from them are computed in int64 by the kernels (num_blocks * block_size * Hkv * D overflows
int32 on large GPUs).

FP8 (``kv_cache_dtype="fp8_e4m3"`` / ``"fp8_e5m2"``)
----------------------------------------------------
The same layout in ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``: one byte per value. Each layer has a
K scale and a V scale (fp32 scalars): the store writes ``saturate(k / k_scale)``, where saturate clamps
to the format's largest finite value (448 for e4m3, 57344 for e5m2), so nothing stored is inf or NaN;
the attention kernels read ``stored * scale``, upcast in registers, with fp32 accumulation.
Scales apply to FP8 caches only: a cache in the model's dtype stores K and V as they are.

Block tables
------------
``block_tables`` is int32 ``[B, max_blocks]``: row b lists the physical blocks of sequence b in token
order. Entries past ``ceil(seq_lens[b] / block_size)`` are padding (0) and must never be read
unmasked.

Decode (one query token per sequence)
-------------------------------------
``q [B, Hq, D]``; ``seq_lens int32 [B]`` counts every token of the sequence *including* the one
being decoded, whose K/V has already been stored. Query head h reads KV head ``h // (Hq // Hkv)``.

Several queries per row (speculative verification) and a sink + window (self-drafting)
--------------------------------------------------------------------------------------
``cu_seqlens_q int32 [B + 1]`` packs the queries: ``q [T, Hq, D]``, row b owning queries
``cu_seqlens_q[b]:cu_seqlens_q[b+1]``. Query i of row b sits at position ``seq_lens[b] - q_len_b + i``
and sees the keys up to it: causal among the row's new tokens, whose K/V are all stored before
attention. ``start_lens [B]`` starts a row's keys later (a window); ``sink_lens [B]`` adds the keys
``[0, sink)`` before that window. Outputs and lse are per query, ``[T, Hq, ...]``.

Cascade (prefix-shared) decode
------------------------------
Rows are ordered so that each group (the sequences forked from one prompt) is contiguous:

- ``group_starts int32 [G + 1]``: CSR offsets; group g owns rows ``group_starts[g]:group_starts[g+1]``.
  Every row belongs to exactly one group (a lone sequence is a group of one).
- ``group_prefix_lens int32 [G]``: tokens of the group's shared prefix, a multiple of block_size,
  possibly 0. The prefix blocks are ``block_tables[group_starts[g], :prefix_len // block_size]``;
  every member's table starts with those same block ids.

Row b's attention = softmax over [shared prefix of its group] ++ [its own suffix
``[prefix_len, seq_lens[b])``], computed as two partial states (unnormalised output, log-sum-exp)
merged exactly. An empty part has lse = -inf and contributes nothing. With several queries per row,
every query of a group sits at or past the group's prefix (it sees all of it).

Prefill / chunked prefill
-------------------------
Queries of S sequences are packed: ``q [Tq, Hq, D]``, ``cu_seqlens_q int32 [S + 1]``,
``seq_lens int32 [S]`` = tokens in the cache after this chunk (the chunk's K/V is stored before
attention runs). Query i of sequence s sits at position ``seq_lens[s] - q_len_s + i`` and attends
causally to positions ``0 ..= that position``.
"""
from __future__ import annotations

import torch

_KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's torch dtype for an EngineConfig.kv_cache_dtype ("auto": the model's)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in _KV_DTYPES:
        raise ValueError(f"kv_cache_dtype must be 'auto' or one of {sorted(_KV_DTYPES)}, got {kv_cache_dtype!r}")
    return _KV_DTYPES[kv_cache_dtype]


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The cache dtype as stats report it: 'fp8_e4m3', 'fp8_e5m2' or the torch name ('bfloat16')."""
    return next((name for name, dt in _KV_DTYPES.items() if dt == dtype), str(dtype).removeprefix("torch."))


def allocate_kv_cache(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                      head_dim: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    return torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim,
                       dtype=dtype, device=device)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    return num_layers * 2 * block_size * num_kv_heads * head_dim * dtype.itemsize


def copy_blocks(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy whole blocks (all layers, K and V): used by fork for a partial last block."""
    kv[:, :, dst] = kv[:, :, src]
