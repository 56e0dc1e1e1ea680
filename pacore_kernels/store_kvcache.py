"""Write the new tokens' K/V into the paged cache at their slots (slot -1 = padding, skipped).

An FP8 cache stores saturate(k / k_scale) and saturate(v / v_scale) (engine/worker/kv_cache.py)."""
from __future__ import annotations

import torch

from ._utils import (HAS_TRITON, check, check_kv_scales, check_rows, check_same_device, fp8_max, is_fp8,
                     next_pow2, quantize_fp8, require_triton, tl, triton)


def store_kvcache_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k, v [T, Hkv, D]; caches [N, bs, Hkv, D]; slot_mapping [T] (int32/int64, -1 = skip).
    k_scale / v_scale: an FP8 cache's per-layer scales (1.0 for a cache in k's dtype)."""
    check_kv_scales(k_cache.dtype, k_scale, v_scale)
    Hkv, D = k_cache.shape[-2:]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    for x, cache, scale in ((k[keep], k_cache, k_scale), (v[keep], v_cache, v_scale)):
        if is_fp8(cache.dtype):  # index_copy_ has no float8 kernels: copy the bytes
            cache.view(torch.uint8).view(-1, Hkv, D).index_copy_(0, slots, quantize_fp8(x, scale, cache.dtype)
                                                                  .view(torch.uint8))
        else:
            cache.view(-1, Hkv, D).index_copy_(0, slots, x.to(cache.dtype))


# --- Triton ---------------------------------------------------------------------------------------

@triton.jit
def _store_kvcache_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_k, stride_v, k_inv, v_inv,
                          HD: tl.constexpr, BLOCK: tl.constexpr, FP8_MAX: tl.constexpr):
    # One program per token: copy its Hkv*D contiguous values into the slot's row of each cache.
    # FP8_MAX > 0: an FP8 cache; scale by the reciprocal scales, saturate, then convert (round to nearest even).
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)  # int64: slot * HD overflows int32 on big caches
    offs = tl.arange(0, BLOCK)
    # slot -1 = padding: store nothing. (Folded into the bound: the interpreter mis-types tensor & scalar.)
    mask = offs < tl.where(slot >= 0, HD, 0)
    k = tl.load(k_ptr + t.to(tl.int64) * stride_k + offs, mask=mask)
    v = tl.load(v_ptr + t.to(tl.int64) * stride_v + offs, mask=mask)
    if FP8_MAX > 0:
        k = tl.clamp(k.to(tl.float32) * k_inv, -FP8_MAX, FP8_MAX)
        v = tl.clamp(v.to(tl.float32) * v_inv, -FP8_MAX, FP8_MAX)
    tl.store(kc_ptr + slot * HD + offs, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + slot * HD + offs, v.to(vc_ptr.dtype.element_ty), mask=mask)


def store_kvcache_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    require_triton()
    check_rows("k", k, 3)
    check_rows("v", v, 3)
    check(k.shape == v.shape, f"k/v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "caches must be equal [N, bs, Hkv, D]")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    check(tuple(k.shape[1:]) == tuple(k_cache.shape[2:]),
          f"k [T, Hkv, D] {tuple(k.shape)} does not match cache {tuple(k_cache.shape)}")
    check(k.dtype == v.dtype and k_cache.dtype == v_cache.dtype and (k_cache.dtype == k.dtype or is_fp8(k_cache.dtype)),
          f"k, v and caches must share a dtype, or the caches be one FP8 format: {k.dtype}, {v.dtype}, "
          f"{k_cache.dtype}, {v_cache.dtype}")
    check_kv_scales(k_cache.dtype, k_scale, v_scale)
    check(slot_mapping.dim() == 1 and slot_mapping.shape[0] == k.shape[0], "slot_mapping must be [T]")
    check(slot_mapping.dtype in (torch.int32, torch.int64) and slot_mapping.is_contiguous(),
          "slot_mapping must be contiguous int32/int64")
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    T = k.shape[0]
    if T == 0:
        return
    HD = k.shape[1] * k.shape[2]
    _store_kvcache_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                1.0 / k_scale, 1.0 / v_scale, HD=HD, BLOCK=next_pow2(HD),
                                FP8_MAX=fp8_max(k_cache.dtype) if is_fp8(k_cache.dtype) else 0.0)

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del store_kvcache_triton
