"""Triton chunked prefill vs the (proven) reference."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

triton = pytest.importorskip("triton")
from kernels.prefill_attention import prefill_attention_ref, prefill_attention_triton  # noqa: E402

DEV = env.DEVICE
DTYPES = [torch.float32] + env.LOW_DTYPES
_poison = env.poison_fixture()  # autouse: torch.empty/empty_like return NaN-filled tensors


def _batch(cases, bs, Hkv, D, qpk, dtype):
    """cases: (tokens in cache after the chunk, chunk length) per sequence."""
    seq = [c for c, _ in cases]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype)
    qlens = [n for _, n in cases]
    i32 = dict(dtype=torch.int32, device=DEV)
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), **i32)
    q = torch.randn(sum(qlens), Hkv * qpk, D, device=DEV).to(dtype)
    return q, kc, vc, bt, cu, torch.tensor(seq, **i32)


# (head_dim, q heads per kv head, block size)
CASES = [(64, 1, 16), (128, 2, 32), (64, 4, 32), (128, 8, 16)]


@pytest.mark.parametrize("D,qpk,bs", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_triton(D, qpk, bs, dtype):
    Hkv = 1 if qpk >= 4 else 2
    # full prefill (non-multiple of bs), chunk after a cached prefix, a one-token chunk, a chunk > one tile
    cases = [(bs + 5, bs + 5), (3 * bs, bs - 3), (2 * bs + 1, 1), (70, 67)]
    args = _batch(cases, bs, Hkv, D, qpk, dtype)
    out = prefill_attention_triton(*args, 1 / math.sqrt(D))
    ref = prefill_attention_ref(*args, 1 / math.sqrt(D))
    assert out.dtype == dtype and out.shape == args[0].shape
    assert env.rel_err(out, ref) < env.TOL[dtype]


def test_prefill_attention_triton_validates():
    q, kc, vc, bt, cu, sl = _batch([(5, 5)], 16, 2, 64, 1, torch.float32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        prefill_attention_triton(q, kc, vc, bt, cu[:1], sl, 0.1)
    with pytest.raises(ValueError, match="contiguous"):
        prefill_attention_triton(q.transpose(0, 1), kc, vc, bt, cu, sl, 0.1)
