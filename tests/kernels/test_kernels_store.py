import _triton_env as env  # noqa: F401  (must come first)

import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.store_kvcache import store_kvcache_ref, store_kvcache_triton  # noqa: E402

DEV = env.DEVICE


@pytest.mark.parametrize("dtype", [torch.float32] + env.LOW_DTYPES)
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
