"""Triton RMSNorm (+ fused residual), RoPE and SiLU-and-mul vs the references (which match HF)."""
import _triton_env as env  # noqa: F401  (must come first)

import pytest
import torch

triton = pytest.importorskip("triton")
from pacore_kernels.activation import silu_and_mul_ref, silu_and_mul_triton  # noqa: E402
from pacore_kernels.rmsnorm import rmsnorm_ref, rmsnorm_triton  # noqa: E402
from pacore_kernels.rope import rope_ref, rope_triton  # noqa: E402

DEV = env.DEVICE
DTYPES = env.DTYPES
_poison = env.poison_fixture()  # autouse: torch.empty/empty_like return NaN-filled tensors


def _close(out, ref, steps: int = 1):
    """fp32: tight; half types: at most `steps` rounding steps apart (fp32 rsqrt/exp may differ by an ulp)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert not torch.isnan(out).any()
    if ref.dtype == torch.float32:
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    else:
        ulp = torch.finfo(ref.dtype).eps
        assert ((out.float() - ref.float()).abs() <= steps * ulp * ref.float().abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,w_fp32", [(64, False), (96, True), (576, False)])
def test_rmsnorm_triton(dtype, H, w_fp32):
    x = torch.randn(5, H, device=DEV).to(dtype)
    w = torch.randn(H, device=DEV).to(torch.float32 if w_fp32 else dtype)
    _close(rmsnorm_triton(x, w, 1e-5), rmsnorm_ref(x, w, 1e-5))
    r = torch.randn(5, H, device=DEV).to(dtype)
    out, res = rmsnorm_triton(x, w, 1e-5, residual=r)
    rout, rres = rmsnorm_ref(x, w, 1e-5, residual=r)
    assert torch.equal(res, rres)
    _close(out, rout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,Hq,Hkv", [(64, 4, 2), (128, 3, 1)])
def test_rope_triton(dtype, D, Hq, Hkv):
    T = 6
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.arange(2048, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DEV)
    pos = torch.randint(0, 2048, (T,), device=DEV)
    qkv = torch.randn(T, Hq + 2 * Hkv, D, device=DEV).to(dtype)  # q, k as strided views into qkv
    q, k = qkv[:, :Hq], qkv[:, Hq:Hq + Hkv]
    rq, rk = rope_ref(pos, q.clone(), k.clone(), cache)
    v_before = qkv[:, Hq + Hkv:].clone()
    oq, ok = rope_triton(pos, q, k, cache)
    assert oq.data_ptr() == q.data_ptr() and ok.data_ptr() == k.data_ptr()
    assert torch.equal(qkv[:, Hq + Hkv:], v_before)  # v untouched
    if dtype == torch.float32:  # GPU may fuse the mul-add (FMA): an ulp
        assert torch.allclose(q, rq, rtol=1e-6, atol=1e-6) and torch.allclose(k, rk, rtol=1e-6, atol=1e-6)
    else:  # same roundings as HF: bit-exact
        assert torch.equal(q, rq) and torch.equal(k, rk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("I", [48, 1536])
def test_silu_and_mul_triton(dtype, I):
    # Two steps: an fp32 exp an ulp apart can round the silu to its neighbouring half value, which the
    # mul then carries (seen about once in 200 fp16 draws under the interpreter).
    x = torch.randn(3, 2 * I, device=DEV).to(dtype)
    _close(silu_and_mul_triton(x), silu_and_mul_ref(x), steps=2)
    x3 = torch.randn(2, 2, 2 * I, device=DEV).to(dtype)
    _close(silu_and_mul_triton(x3), silu_and_mul_ref(x3), steps=2)


def test_pointwise_validate():
    with pytest.raises(ValueError, match="weight"):
        rmsnorm_triton(torch.randn(2, 8, device=DEV), torch.randn(4, device=DEV), 1e-5)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rope_triton(torch.zeros(2, dtype=torch.int64, device=DEV), torch.randn(2, 2, 8, device=DEV),
                    torch.randn(2, 1, 8, device=DEV), torch.randn(4, 8, device=DEV).double())
    with pytest.raises(ValueError, match="2I"):
        silu_and_mul_triton(torch.randn(2, 7, device=DEV))
