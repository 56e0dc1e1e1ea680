"""Triton paged decode vs the (proven) reference, under the interpreter on CPU or on CUDA."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.paged_decode import paged_decode_ref, paged_decode_triton  # noqa: E402

DEV = env.DEVICE
DTYPES = [torch.float32] + env.LOW_DTYPES
_poison = env.poison_fixture()  # autouse: torch.empty/empty_like return NaN-filled tensors

# (head_dim, gqa ratio, block size, num_splits, with start_lens): a sample of the grid in which every
# axis value appears; None = heuristic; 12 splits > the 5 blocks of the longest row (empty splits).
CASES = [(64, 1, 16, None, False), (64, 2, 32, 3, True), (128, 4, 16, 1, True), (128, 8, 32, 12, False),
         (64, 8, 16, 2, True), (128, 1, 32, 5, False), (64, 4, 32, 12, True), (128, 2, 16, 3, False)]


@pytest.mark.parametrize("D,ratio,bs,splits,with_start", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
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
