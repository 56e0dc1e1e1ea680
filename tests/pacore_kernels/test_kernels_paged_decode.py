"""Triton paged decode vs the (proven) reference, under the interpreter on CPU or on CUDA."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

triton = pytest.importorskip("triton")
from pacore_kernels.paged_decode import paged_decode_ref, paged_decode_triton  # noqa: E402

DEV = env.DEVICE
_poison = env.poison_fixture()  # autouse: torch.empty/empty_like return NaN-filled tensors

# (head_dim, gqa ratio, block size, num_splits, with start_lens): a sample of the grid in which every
# axis value appears; None = heuristic; 12 splits > the 5 blocks of the longest row (empty splits).
CASES = [(64, 1, 16, None, False), (64, 2, 32, 3, True), (128, 4, 16, 1, True), (128, 8, 32, 12, False),
         (64, 8, 16, 2, True), (128, 1, 32, 5, False), (64, 4, 32, 12, True), (128, 2, 16, 3, False)]


# fp16 on a GPU: head dims 64 and 128, split and direct output, a start and empty splits
@pytest.mark.parametrize("dtype,D,ratio,bs,splits,with_start", env.grid(CASES, gpu_other=[1, 2, 3]))
def test_paged_decode_triton(D, ratio, bs, splits, dtype, with_start):
    Hkv = 2 if ratio < 8 else 1
    seq = [1, bs, bs + 1, 3 * bs - 5, 4 * bs + 7]
    # starts: whole, one-token suffix, empty range, mid-block start, block-aligned start
    start = [0, bs - 1, bs + 1, bs + 3, 2 * bs]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype)
    q = torch.randn(len(seq), Hkv * ratio, D, device=DEV).to(dtype)
    sl = torch.tensor(seq, dtype=torch.int32, device=DEV)
    st = torch.tensor(start, dtype=torch.int32, device=DEV) if with_start else None
    sc = 1 / math.sqrt(D)
    out, lse = paged_decode_triton(q, kc, vc, bt, sl, sc, start_lens=st, return_lse=True, num_splits=splits)
    ref, ref_lse = paged_decode_ref(q, kc, vc, bt, sl, sc, start_lens=st, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32
    assert env.rel_err(out, ref) < env.TOL[dtype]
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-3
    if with_start:  # the empty range is exactly zero
        assert (out[2] == 0).all()
    if splits == 3:  # the plain (no lse) entry point gives the same output
        out2 = paged_decode_triton(q, kc, vc, bt, sl, sc, start_lens=st, num_splits=splits)
        assert torch.allclose(out2.float(), out.float(), atol=1e-6, rtol=0)


def test_paged_decode_triton_validates():
    kc, vc, bt = env.make_paged([5], 16, 2, 64, torch.float32)
    q = torch.randn(1, 4, 64, device=DEV)
    sl = torch.tensor([5], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_decode_triton(q.half(), kc, vc, bt, sl, 0.1)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_triton(torch.randn(1, 3, 64, device=DEV), kc, vc, bt, sl, 0.1)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_decode_triton(q, kc, vc, bt, sl.float(), 0.1)


# --- FP8 caches: read as stored * scale, upcast in registers -----------------------------------------
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _dequantized(cache, scale):
    """The FP8 cache as fp32 values (NaN padding stays NaN): what the kernels must attend to."""
    return cache.float() * scale


@pytest.mark.parametrize("fp8", FP8)  # on a GPU: both head dims in bf16, fp16 the 128 one
@pytest.mark.parametrize("dtype,D,ratio,bs,splits,with_start",
                         env.grid([CASES[1], CASES[3], CASES[6]], gpu_first=[0, 1], gpu_other=[1]))
def test_paged_decode_fp8_triton_matches_reference(fp8, dtype, D, ratio, bs, splits, with_start):
    Hkv = 2 if ratio < 8 else 1
    seq = [1, bs, bs + 1, 3 * bs - 5, 4 * bs + 7]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, fp8)
    q = torch.randn(len(seq), Hkv * ratio, D, device=DEV).to(dtype)
    sl = torch.tensor(seq, dtype=torch.int32, device=DEV)
    st = torch.tensor([0, bs - 1, bs + 1, bs + 3, 2 * bs], dtype=torch.int32, device=DEV) if with_start else None
    sc, ks, vs = 1 / math.sqrt(D), 0.5, 3.0
    out, lse = paged_decode_triton(q, kc, vc, bt, sl, sc, start_lens=st, return_lse=True, num_splits=splits,
                                   k_scale=ks, v_scale=vs)
    ref, ref_lse = paged_decode_ref(q, kc, vc, bt, sl, sc, start_lens=st, return_lse=True, k_scale=ks, v_scale=vs)
    assert out.dtype == dtype and env.rel_err(out, ref) < env.TOL[dtype]
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)) and (lse[fin] - ref_lse[fin]).abs().max() < 1e-3
    # The reference attends to stored * scale: the same as over the dequantized fp32 cache.
    plain = paged_decode_ref(q.float(), _dequantized(kc, ks), _dequantized(vc, vs), bt, sl, sc, start_lens=st)
    assert env.rel_err(ref, plain) < (1e-5 if dtype == torch.float32 else env.TOL[dtype])


def test_paged_decode_fp8_validates():
    kc, vc, bt = env.make_paged([5], 16, 2, 64, torch.float8_e4m3fn)
    q = torch.randn(1, 4, 64, device=DEV)
    sl = torch.tensor([5], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_decode_triton(q, kc, vc.to(torch.float8_e5m2), bt, sl, 0.1)
    with pytest.raises(ValueError, match="v_scale must be a positive finite number"):
        paged_decode_triton(q, kc, vc, bt, sl, 0.1, v_scale=float("nan"))
    with pytest.raises(ValueError, match="apply to FP8 caches only"):
        paged_decode_triton(q, kc.float(), vc.float(), bt, sl, 0.1, k_scale=2.0)
