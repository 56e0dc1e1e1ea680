"""Write the new tokens' K/V into the paged cache at their slots (slot -1 = padding, skipped)."""
from __future__ import annotations

import torch

from ._utils import check


def store_kvcache_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """k, v [T, Hkv, D]; caches [N, bs, Hkv, D]; slot_mapping [T] (int32/int64, -1 = skip)."""
    Hkv, D = k_cache.shape[-2:]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    k_cache.view(-1, Hkv, D).index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_cache.view(-1, Hkv, D).index_copy_(0, slots, v[keep].to(v_cache.dtype))
