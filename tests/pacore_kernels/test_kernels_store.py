import _triton_env as env  # noqa: F401  (must come first)

import pytest
import torch

triton = pytest.importorskip("triton")
from pacore_kernels.store_kvcache import store_kvcache_ref, store_kvcache_triton  # noqa: E402

DEV = env.DEVICE


@pytest.mark.parametrize("dtype", env.DTYPES)
@pytest.mark.parametrize("Hkv,D,bs,slot_dtype", [(2, 64, 16, torch.int32), (1, 128, 32, torch.int64),
                                                  (3, 64, 32, torch.int64)])
def test_store_kvcache_triton(dtype, Hkv, D, bs, slot_dtype):
    N, T = 5, 23
    kc = torch.randn(N, bs, Hkv, D, device=DEV).to(dtype)
    vc = torch.randn(N, bs, Hkv, D, device=DEV).to(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    # k/v as strided views of a packed qkv row, as the engine's projection produces them
    qkv = torch.randn(T, (4 + 2) * Hkv, D, device=DEV).to(dtype)
    k, v = qkv[:, 4 * Hkv:5 * Hkv], qkv[:, 5 * Hkv:]
    slots = torch.randperm(N * bs)[:T].to(slot_dtype)
    slots[::4] = -1
    slots = slots.to(DEV)
    store_kvcache_triton(k, v, kc, vc, slots)
    store_kvcache_ref(k, v, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_store_kvcache_triton_validates():
    kc = torch.zeros(2, 16, 2, 64, device=DEV)
    k = torch.zeros(3, 2, 64, device=DEV)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kvcache_triton(k, k, kc, kc.clone(), torch.zeros(3, device=DEV))
    with pytest.raises(ValueError, match="does not match"):
        store_kvcache_triton(k[:, :1], k[:, :1], kc, kc.clone(), torch.zeros(3, dtype=torch.int32, device=DEV))


# --- FP8 caches -------------------------------------------------------------------------------------
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# Round-trip bound of one FP8 value: half an ulp relative (3 / 2 mantissa bits), or half the smallest
# subnormal (2^-9 / 2^-16) absolute, times the scale.
FP8_BOUND = {torch.float8_e4m3fn: (2.0 ** -4, 2.0 ** -10), torch.float8_e5m2: (2.0 ** -3, 2.0 ** -17)}


def _bytes(t):
    return t.view(torch.uint8)


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype,scale", [(torch.float32, 1.0), (torch.bfloat16, 0.37), (torch.float16, 3.0)])
def test_store_fp8_round_trip_error_is_bounded(fp8, dtype, scale):
    N, bs, Hkv, D, T = 4, 16, 2, 64, 40
    kc = torch.zeros(N, bs, Hkv, D, dtype=fp8)
    vc = torch.zeros_like(kc)
    k = (torch.randn(T, Hkv, D) * 8).to(dtype)
    v = (torch.randn(T, Hkv, D) * torch.logspace(-6, 2, D)).to(dtype)  # tiny to large: subnormals too
    slots = torch.randperm(N * bs)[:T]
    store_kvcache_ref(k, v, kc, vc, slots, k_scale=scale, v_scale=2 * scale)
    rel, absolute = FP8_BOUND[fp8]
    for x, cache, s in ((k, kc, scale), (v, vc, 2 * scale)):
        back = cache.view(-1, Hkv, D)[slots].float() * s
        err = (back - x.float()).abs()
        assert (err <= x.float().abs() * rel + absolute * s).all()


@pytest.mark.parametrize("fp8", FP8)
def test_store_fp8_saturates_out_of_range_values(fp8):
    top = torch.finfo(fp8).max  # 448 / 57344
    kc = torch.zeros(1, 16, 1, 8, dtype=fp8)
    vc = torch.zeros_like(kc)
    k = torch.tensor([1e9, -1e9, float("inf"), -float("inf"), 3 * top, -3 * top, 1.0, 0.0]).view(1, 1, 8)
    k = k.expand(2, 1, 8).contiguous()
    store_kvcache_ref(k, k, kc, vc, torch.tensor([0, 5]), k_scale=1.0, v_scale=0.5)
    for cache in (kc, vc):
        got = cache.view(-1, 8)[[0, 5]].float()
        assert torch.isfinite(got).all()
        assert got[:, :6].tolist() == [[top, -top] * 3] * 2
    assert kc.view(-1, 8)[0, 6:].tolist() == [1.0, 0.0] and vc.view(-1, 8)[0, 6:].tolist() == [2.0, 0.0]


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", env.DTYPES)
def test_store_fp8_triton_matches_reference(fp8, dtype):
    """Same bytes as the reference. Under the interpreter the values are chosen on the FP8 grid (times a
    power-of-two scale) or out of range: its float -> FP8 conversion rounds wrongly (round half up, and a
    mantissa that rounds up into the next power of two loses its exponent carry, giving half the value),
    whereas a GPU converts with round-to-nearest-even, as torch does. Scaling, saturation, addressing
    and padding are what this checks there; on CUDA, random values check the rounding too."""
    N, bs, Hkv, D, T = 5, 16, 2, 64, 23
    kc = torch.zeros(N, bs, Hkv, D, dtype=fp8, device=DEV)
    vc = torch.zeros_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    qkv = torch.randn(T, 6 * Hkv, D) * 4
    if DEV == "cpu":  # normal FP8 values (|x| >= 1) times powers of two: on the grid at every scale below
        qkv = (qkv.sign() + qkv).to(fp8).float() * torch.tensor([0.5, 1.0, 2.0, 4.0]).repeat(D // 4)
    qkv[3, :, :4] = torch.tensor([1e9, -1e9, float("inf"), 7e4])  # saturate
    qkv = qkv.to(dtype=dtype, device=DEV)
    k, v = qkv[:, 4 * Hkv:5 * Hkv], qkv[:, 5 * Hkv:]
    slots = torch.randperm(N * bs)[:T]
    slots[::4] = -1
    slots = slots.to(DEV)
    for scale in (1.0, 0.5, 4.0) if DEV == "cpu" else (1.0, 0.37, 5.3):
        store_kvcache_triton(k, v, kc, vc, slots, k_scale=scale, v_scale=2 * scale)
        store_kvcache_ref(k, v, kc2, vc2, slots, k_scale=scale, v_scale=2 * scale)
        assert torch.equal(_bytes(kc), _bytes(kc2)) and torch.equal(_bytes(vc), _bytes(vc2))
        assert torch.isfinite(kc.float()).all() and torch.isfinite(vc.float()).all()


def test_store_fp8_validates_scales():
    kc = torch.zeros(2, 16, 2, 64, dtype=torch.float8_e4m3fn, device=DEV)
    k = torch.zeros(3, 2, 64, device=DEV)
    slots = torch.zeros(3, dtype=torch.int64, device=DEV)
    for fn in (store_kvcache_triton, store_kvcache_ref):
        with pytest.raises(ValueError, match="k_scale must be a positive finite number"):
            fn(k, k, kc, kc.clone(), slots, k_scale=0.0)
        with pytest.raises(ValueError, match="apply to FP8 caches only"):
            fn(k, k, kc.float(), kc.float(), slots, v_scale=2.0)
