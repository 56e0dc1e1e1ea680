"""Write the new tokens' K/V into the paged cache at their slots (slot -1 = padding, skipped)."""
from __future__ import annotations

import torch

from ._utils import HAS_TRITON, check, check_rows, check_same_device, next_pow2, require_triton, tl, triton


def store_kvcache_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """k, v [T, Hkv, D]; caches [N, bs, Hkv, D]; slot_mapping [T] (int32/int64, -1 = skip)."""
    Hkv, D = k_cache.shape[-2:]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    k_cache.view(-1, Hkv, D).index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_cache.view(-1, Hkv, D).index_copy_(0, slots, v[keep].to(v_cache.dtype))


# --- Triton ---------------------------------------------------------------------------------------

@triton.jit
def _store_kvcache_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_k, stride_v,
                          HD: tl.constexpr, BLOCK: tl.constexpr):
    # One program per token: copy its Hkv*D contiguous values into the slot's row of each cache.
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)  # int64: slot * HD overflows int32 on big caches
    offs = tl.arange(0, BLOCK)
    # slot -1 = padding: store nothing. (Folded into the bound: the interpreter mis-types tensor & scalar.)
    mask = offs < tl.where(slot >= 0, HD, 0)
    k = tl.load(k_ptr + t.to(tl.int64) * stride_k + offs, mask=mask)
    v = tl.load(v_ptr + t.to(tl.int64) * stride_v + offs, mask=mask)
    tl.store(kc_ptr + slot * HD + offs, k, mask=mask)
    tl.store(vc_ptr + slot * HD + offs, v, mask=mask)


def store_kvcache_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         slot_mapping: torch.Tensor) -> None:
    require_triton()
    check_rows("k", k, 3)
    check_rows("v", v, 3)
    check(k.shape == v.shape, f"k/v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "caches must be equal [N, bs, Hkv, D]")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    check(tuple(k.shape[1:]) == tuple(k_cache.shape[2:]),
          f"k [T, Hkv, D] {tuple(k.shape)} does not match cache {tuple(k_cache.shape)}")
    check(k.dtype == k_cache.dtype == v.dtype == v_cache.dtype, "k, v and caches must share a dtype")
    check(slot_mapping.dim() == 1 and slot_mapping.shape[0] == k.shape[0], "slot_mapping must be [T]")
    check(slot_mapping.dtype in (torch.int32, torch.int64) and slot_mapping.is_contiguous(),
          "slot_mapping must be contiguous int32/int64")
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    T = k.shape[0]
    if T == 0:
        return
    HD = k.shape[1] * k.shape[2]
    _store_kvcache_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                HD=HD, BLOCK=next_pow2(HD))

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del store_kvcache_triton
