"""Verification-guided block importance (pacore_kernels/block_importance.py), emitted by the verify attention
kernels: the torch references against dense fp64 attention, then the Triton kernels (the interpreter on CPU;
fp32 and fp16: the interpreter's bf16 dot is wrong) against the references, with empty splits, tails and
contexts that are not a multiple of the block size."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

from pacore_kernels._utils import HAS_TRITON
from pacore_kernels.cascade_decode import cascade_decode_ref
from pacore_kernels.paged_decode import paged_decode_ref

DEV = env.DEVICE
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton does not import")
DTYPES = [d for d in env.DTYPES if d != torch.bfloat16]
TOL = {torch.float32: 1e-4, torch.float16: 1e-2}


def _i32(xs):
    return torch.tensor(xs, dtype=torch.int32, device=DEV)


def _queries(qlens, Hq, D, dtype, gen):
    cu = _i32([0] + torch.tensor(qlens).cumsum(0).tolist())
    return torch.randn(int(cu[-1]), Hq, D, generator=gen).to(dtype=dtype, device=DEV), cu


def _expected(q, kc, bt, seq, qlens, sc, width):
    """Per row and block column: the largest softmax probability any of its queries (any head) gave a key
    of the block, from dense fp64 attention over the positions each query sees."""
    bs, Hkv = kc.shape[1], kc.shape[2]
    G = q.shape[1] // Hkv
    out = torch.zeros(len(seq), width, dtype=torch.float64)
    t = 0
    for b, (s, n) in enumerate(zip(seq, qlens)):
        for i in range(n):
            pos = torch.arange(s - n + i + 1)
            slots = bt[b].long()[pos // bs] * bs + pos % bs
            k = kc.reshape(-1, Hkv, kc.shape[3])[slots].double()                        # [P, Hkv, D]
            sc_ = torch.einsum("hgd,phd->hgp", q[t].double().reshape(Hkv, G, -1), k) * sc
            p = torch.softmax(sc_, -1).amax((0, 1))                                      # [P]
            out[b].scatter_reduce_(0, pos // bs, p, "amax")
            t += 1
    return out


CASE = dict(seq=[7, 50, 17, 32, 5, 66, 1, 40], qlens=[1, 5, 3, 2, 5, 4, 1, 0])  # tails, a padding row (0 queries)


def test_reference_importance_is_the_largest_probability_per_block():
    gen = torch.Generator().manual_seed(0)
    bs, Hkv, D = 16, 2, 64
    seq, qlens = CASE["seq"], CASE["qlens"]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, torch.float32, gen=gen)
    q, cu = _queries(qlens, 4 * Hkv, D, torch.float32, gen)
    imp = torch.full(bt.shape, float("nan"), device=DEV)
    sc = 1 / math.sqrt(D)
    out = paged_decode_ref(q, kc, vc, bt, _i32(seq), sc, cu_seqlens_q=cu, importance=imp)
    assert torch.equal(out, paged_decode_ref(q, kc, vc, bt, _i32(seq), sc, cu_seqlens_q=cu))  # output unchanged
    exp = _expected(q, kc, bt, seq, qlens, sc, bt.shape[1])
    assert (imp.double().cpu() - exp).abs().max() < 1e-5
    assert (imp[7] == 0).all() and imp[0, 1:].eq(0).all()  # no query, no block read: 0


def test_cascade_reference_importance_covers_the_shared_prefix():
    gen = torch.Generator().manual_seed(3)
    bs, Hkv, D = 16, 2, 64
    groups, prefix = [3, 1, 2], [2 * bs, 0, bs]
    seq = [2 * bs + 5, 3 * bs, 2 * bs + 1, 9, bs + 2, 2 * bs + 7]
    qlens = [5, 1, 2, 3, 2, 1]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, torch.float32, groups=groups, prefix_lens=prefix, gen=gen)
    q, cu = _queries(qlens, 4 * Hkv, D, torch.float32, gen)
    sc = 1 / math.sqrt(D)
    imp, exp = torch.empty(bt.shape, device=DEV), torch.empty(bt.shape, device=DEV)
    cascade_decode_ref(q, kc, vc, bt, _i32(seq), _i32([0, 3, 4, 6]), _i32(prefix), sc, cu_seqlens_q=cu, importance=imp)
    paged_decode_ref(q, kc, vc, bt, _i32(seq), sc, cu_seqlens_q=cu, importance=exp)
    assert (imp - exp).abs().max() < 1e-5 and imp[:3, :2].gt(0).all()


# (head_dim, q heads per kv head, block size, num_splits); 12 splits leave most of them empty; block size 48
# is not a power of two (a tile spans a block edge), 8 is below a tile
CASES = [(64, 4, 16, 1), (64, 2, 16, 3), (128, 8, 32, 12), (64, 1, 48, 5), (64, 2, 8, None)]


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D,ratio,bs,splits", CASES)
def test_triton_importance_matches_the_reference(D, ratio, bs, splits, dtype):
    from pacore_kernels.paged_decode import paged_decode_triton
    gen = torch.Generator().manual_seed(10)
    Hkv = 2 if ratio < 8 else 1
    seq, qlens = CASE["seq"], CASE["qlens"]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, gen=gen)
    q, cu = _queries(qlens, Hkv * ratio, D, dtype, gen)
    sc = 1 / math.sqrt(D)
    imp, ref = torch.empty(bt.shape, device=DEV), torch.empty(bt.shape, device=DEV)
    out = paged_decode_triton(q, kc, vc, bt, _i32(seq), sc, num_splits=splits, cu_seqlens_q=cu, max_query_len=5,
                              importance=imp)
    plain = paged_decode_triton(q, kc, vc, bt, _i32(seq), sc, num_splits=splits, cu_seqlens_q=cu, max_query_len=5)
    assert torch.equal(out, plain)  # asking for importance changes no output bit
    paged_decode_ref(q, kc, vc, bt, _i32(seq), sc, cu_seqlens_q=cu, importance=ref)
    assert (imp - ref).abs().max() < TOL[dtype]
    # one query per row (no cu_seqlens_q): the single-query path folds its scores too
    last = cu[1:][torch.tensor(CASE["qlens"], device=DEV) > 0] - 1
    rows = [b for b, n in enumerate(qlens) if n]
    imp1, ref1 = torch.empty(len(rows), bt.shape[1], device=DEV), torch.empty(len(rows), bt.shape[1], device=DEV)
    paged_decode_triton(q[last], kc, vc, bt[rows], _i32(seq)[rows], sc, num_splits=splits, importance=imp1)
    paged_decode_ref(q[last], kc, vc, bt[rows], _i32(seq)[rows], sc, importance=ref1)
    assert (imp1 - ref1).abs().max() < TOL[dtype]


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("suffix_splits,programs", [(1, 3), (4, 7)])
def test_triton_cascade_importance_matches_the_reference(dtype, suffix_splits, programs):
    from pacore_kernels.cascade_decode import cascade_decode_triton
    gen = torch.Generator().manual_seed(4)
    bs, Hkv, D = 16, 2, 64
    groups, prefix = [3, 1, 2], [2 * bs, 0, bs]
    seq = [2 * bs + 5, 3 * bs, 2 * bs + 1, 9, bs + 2, 2 * bs + 7]
    qlens = [5, 1, 2, 3, 2, 1]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, groups=groups, prefix_lens=prefix, gen=gen)
    q, cu = _queries(qlens, 4 * Hkv, D, dtype, gen)
    sc = 1 / math.sqrt(D)
    args = (q, kc, vc, bt, _i32(seq), _i32([0, 3, 4, 6]), _i32(prefix), sc)
    imp, ref = torch.empty(bt.shape, device=DEV), torch.empty(bt.shape, device=DEV)
    out = cascade_decode_triton(*args, cu_seqlens_q=cu, max_query_len=5, max_group_size=3, importance=imp,
                                suffix_splits=suffix_splits, num_programs=programs)
    plain = cascade_decode_triton(*args, cu_seqlens_q=cu, max_query_len=5, max_group_size=3,
                                  suffix_splits=suffix_splits, num_programs=programs)
    assert torch.equal(out, plain)
    cascade_decode_ref(*args, cu_seqlens_q=cu, importance=ref)
    assert (imp - ref).abs().max() < TOL[dtype]
