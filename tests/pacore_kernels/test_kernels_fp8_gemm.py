"""FP8 weights (pacore_kernels/fp8_gemm.py): quantize/dequantize round trips, the reference's arithmetic, and the
Triton block-scale GEMM against it (under the interpreter: FP8 values held in fp32 / fp16)."""
import _triton_env as env  # noqa: F401  (must come first)

import pytest
import torch
import torch.nn.functional as F

from pacore_kernels.fp8_gemm import (FP8, FP8_MAX, dequantize_weight, fp8_linear, fp8_linear_ref, gemm_path,
                              quantize_rows_ref, quantize_weight)

DEV = env.DEVICE
E4M3_REL = 2.0 ** -4 + 1e-6  # e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 of itself (+ fp32 noise)


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 3  # rows of different ranges
    w[1] = 0.0  # an all-zero row: its scale must not be 0 / 0
    return w.to(DEV)


@pytest.mark.parametrize("block", [None, (32, 32), (128, 128)], ids=["channel", "block32", "block128"])
def test_quantize_dequantize_round_trip(block):
    w = _weight(70, 200)  # neither a multiple of the blocks: partial tiles at the edges
    q, scale = quantize_weight(w, block)
    assert q.dtype == FP8 and q.shape == w.shape and scale.dtype == torch.float32
    assert scale.shape == ((70,) if block is None else (-(-70 // block[0]), -(-200 // block[1])))
    back = dequantize_weight(q, scale, block, torch.float32)
    assert torch.isfinite(back).all() and (back[1] == 0).all()
    rows = scale.view(-1, 1) if block is None else scale.repeat_interleave(block[0], 0)[:70].repeat_interleave(
        block[1], 1)[:, :200]
    # normals within 2^-4 relative; below e4m3's smallest normal (2^-6 times the scale) the step is 2^-9
    assert ((back - w).abs() <= E4M3_REL * w.abs() + rows * 2.0 ** -10).all()
    # each scale maps its tile's largest |w| onto e4m3's largest value, 448
    if block is None:
        assert (q.float().abs().amax(1)[torch.arange(70) != 1] == FP8_MAX).all()
    else:
        assert q.float().abs()[:block[0], :block[1]].amax() == FP8_MAX


def test_activations_quantize_per_token_and_per_group():
    x = torch.randn(4, 96, device=DEV) * torch.tensor([1e-3, 1.0, 50.0, 0.0], device=DEV).view(4, 1)
    q, s = quantize_rows_ref(x)
    assert s.shape == (4, 1) and torch.isfinite(q.float()).all()
    assert torch.allclose(q.float()[:3].abs().amax(1), torch.full((3,), FP8_MAX, device=DEV))
    q, s = quantize_rows_ref(x, 32)
    assert s.shape == (4, 3) and (q.float()[3] == 0).all()
    back = (q.float().view(4, 3, 32) * s.unsqueeze(-1)).view(4, 96)
    assert ((back - x).abs() <= E4M3_REL * x.abs() + s.repeat_interleave(32, 1) * 2.0 ** -10).all()


@pytest.mark.parametrize("block", [None, (32, 32)], ids=["channel", "block32"])
def test_reference_is_the_dequantized_product_and_close_to_the_full_precision_one(block):
    g = torch.Generator().manual_seed(1)
    w, x, bias = _weight(48, 96), torch.randn(7, 96, generator=g).to(DEV), torch.randn(48, generator=g).to(DEV)
    q, scale = quantize_weight(w, block)
    out = fp8_linear_ref(x, q, scale, bias, block)
    xq, xs = quantize_rows_ref(x, None if block is None else block[1])
    x_back = xq.float() * (xs if block is None else xs.repeat_interleave(block[1], 1))
    exact = F.linear(x_back, dequantize_weight(q, scale, block, torch.float32), bias)
    assert torch.allclose(out, exact, rtol=1e-4, atol=1e-4)  # the scales applied after the dot, not before
    full = F.linear(x, w, bias)
    assert env.rel_err(out, full) < 0.1  # both operands within 2^-4 per element (~3% typical at K=96)


def test_invariant_rows_do_not_depend_on_the_batch():
    w, x = _weight(40, 64), torch.randn(37, 64, device=DEV)
    q, scale = quantize_weight(w)
    whole = fp8_linear(x, q, scale, invariant=True)
    assert torch.equal(fp8_linear(x[:3], q, scale, invariant=True), whole[:3])
    assert torch.equal(fp8_linear(x[20:], q, scale, invariant=True), whole[20:])


def test_paths():
    assert gemm_path(torch.device("cpu"), torch.bfloat16, None, 4096, 4096) == "reference"
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_linear(torch.randn(2, 8), torch.randn(4, 8), torch.ones(4))


triton = pytest.importorskip("triton")
from pacore_kernels.fp8_gemm import fp8_block_gemm_triton  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,N,K,block", [(5, 96, 160, (32, 32)), (17, 130, 200, (128, 128))])
def test_triton_block_gemm_matches_the_reference(dtype, M, N, K, block):
    w, x = _weight(N, K, seed=M), torch.randn(M, K, device=DEV)
    q, scale = quantize_weight(w, block)
    xq, xs = quantize_rows_ref(x, block[1])
    out = fp8_block_gemm_triton(xq.to(dtype), xs, q.to(dtype), scale, block, torch.float32)
    ref = fp8_linear_ref(x, q, scale, None, block)  # quantizes x the same way
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_triton_block_gemm_checks_its_inputs():
    a, s = torch.zeros(4, 64, device=DEV), torch.ones(4, 2, device=DEV)
    b, bs = torch.zeros(32, 64, device=DEV), torch.ones(1, 2, device=DEV)
    with pytest.raises(ValueError, match="share a dtype"):
        fp8_block_gemm_triton(a, s, b.half(), bs, (32, 32), torch.float32)
    with pytest.raises(ValueError, match="scales"):
        fp8_block_gemm_triton(a, s[:, :1], b, bs, (32, 32), torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        fp8_block_gemm_triton(a, s, b, bs, (32, 24), torch.float32)


@pytest.mark.skipif(DEV != "cuda" or not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="FP8 tensor cores: sm_89+ (the CPU runs the reference, above)")
@pytest.mark.parametrize("block", [None, (128, 128)], ids=["scaled_mm", "triton_block"])
def test_the_gpu_paths_match_the_reference(block):
    w, x = _weight(384, 512), torch.randn(33, 512, device=DEV).to(torch.bfloat16)
    q, scale = quantize_weight(w, block)
    assert gemm_path(x.device, x.dtype, block, 384, 512) == ("scaled_mm" if block is None else "triton_block")
    out = fp8_linear(x, q, scale, None, block)
    assert out.dtype == torch.bfloat16 and env.rel_err(out, fp8_linear_ref(x, q, scale, None, block)) < 1e-2
