"""The paged KV cache: its memory layout and the batch metadata every attention path reads.

This docstring is the one place the layout is written down; `kernels/` and `engine/` both follow it.

Storage
-------
One preallocated tensor for the whole model::

    kv = torch.empty(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = kv[layer, 0], kv[layer, 1]      # each [num_blocks, block_size, Hkv, D], contiguous

A token's *slot* is ``block_id * block_size + offset``; ``k_cache.view(-1, Hkv, D)[slot]`` is its key.
``slot_mapping`` entries of -1 mean "do not store" (padding). Block ids, slots and every offset
derived from them are computed in int64 by the kernels (num_blocks * block_size * Hkv * D overflows
int32 on large GPUs).

Block tables
------------
``block_tables`` is int32 ``[B, max_blocks]``: row b lists the physical blocks of sequence b in token
order. Entries past ``ceil(seq_lens[b] / block_size)`` are padding (0) and must never be read
unmasked.

Decode (one query token per sequence)
-------------------------------------
``q [B, Hq, D]``; ``seq_lens int32 [B]`` counts every token of the sequence *including* the one
being decoded, whose K/V has already been stored. Query head h reads KV head ``h // (Hq // Hkv)``.

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
merged exactly. An empty part has lse = -inf and contributes nothing.

Prefill / chunked prefill
-------------------------
Queries of S sequences are packed: ``q [Tq, Hq, D]``, ``cu_seqlens_q int32 [S + 1]``,
``seq_lens int32 [S]`` = tokens in the cache after this chunk (the chunk's K/V is stored before
attention runs). Query i of sequence s sits at position ``seq_lens[s] - q_len_s + i`` and attends
causally to positions ``0 ..= that position``.
"""
from __future__ import annotations

import torch


def allocate_kv_cache(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                      head_dim: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    return torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim,
                       dtype=dtype, device=device)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return num_layers * 2 * block_size * num_kv_heads * head_dim * elem


def copy_blocks(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy whole blocks (all layers, K and V): used by fork for a partial last block."""
    kv[:, :, dst] = kv[:, :, src]
