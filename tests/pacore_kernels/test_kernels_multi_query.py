"""Decode with several queries per row (speculative verification) and with a sink + window (self-drafting):
the torch references against dense fp64 attention over the positions each query may see, then the Triton
kernels (the interpreter on CPU) against the references."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

from pacore_kernels._utils import HAS_TRITON
from pacore_kernels.cascade_decode import cascade_decode_ref
from pacore_kernels.paged_decode import paged_decode_ref

DEV = env.DEVICE


def _queries(seq, qlens, Hq, D, dtype, gen):
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=DEV)
    q = torch.randn(int(cu[-1]), Hq, D, generator=gen).to(dtype=dtype, device=DEV)
    return q, cu


def _expected(q, kc, vc, bt, seq, qlens, start, sink, sc):
    """Per query: the positions it sees, then dense fp64 attention."""
    rows = []
    for b, (s, n) in enumerate(zip(seq, qlens)):
        for i in range(n):
            qpos = s - n + i
            seen = [p for p in range(min(sink[b], start[b]))] + list(range(start[b], qpos + 1))
            rows.append((b, seen))
    outs = [env.naive_attention(q[t:t + 1], kc, vc, bt[b], [seen], sc) for t, (b, seen) in enumerate(rows)]
    return torch.cat(outs)


@pytest.mark.parametrize("Hkv,ratio,bs", [(2, 1, 16), (2, 4, 16), (1, 8, 32)])
def test_multi_query_decode_is_causal_attention_over_each_queries_prefix(Hkv, ratio, bs):
    gen = torch.Generator().manual_seed(0)
    D = 64
    # rows: one query (plain decode), a full verify run, runs crossing a block edge, a row shorter than its run
    seq = [7, 3 * bs + 2, bs + 1, 2 * bs, 5]
    qlens = [1, 5, 3, 2, 5]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, torch.float32, gen=gen)
    q, cu = _queries(seq, qlens, Hkv * ratio, D, torch.float32, gen)
    sl = torch.tensor(seq, dtype=torch.int32, device=DEV)
    sc = 1 / math.sqrt(D)
    out, lse = paged_decode_ref(q, kc, vc, bt, sl, sc, return_lse=True, cu_seqlens_q=cu)
    exp = _expected(q, kc, vc, bt, seq, qlens, [0] * 5, [0] * 5, sc)
    assert out.shape == q.shape and lse.shape == q.shape[:2]
    assert (out.double() - exp).abs().max() < 1e-5
    # one query per row: the same as the plain decode call
    last = cu[1:] - 1
    plain = paged_decode_ref(q[last], kc, vc, bt, sl, sc)
    assert torch.allclose(plain, out[last], atol=1e-6)


def test_multi_query_decode_with_start_and_sink_sees_sink_then_window():
    gen = torch.Generator().manual_seed(1)
    bs, Hkv, D = 16, 2, 64
    seq = [90, 40, 20, 70]
    qlens = [1, 3, 1, 2]
    start = [60, 33, 0, 5]   # window starts (the sink is clipped to the window's start)
    sink = [4, 16, 8, 12]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, torch.float32, gen=gen)
    q, cu = _queries(seq, qlens, 2 * Hkv, D, torch.float32, gen)
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)  # noqa: E731
    sc = 1 / math.sqrt(D)
    out = paged_decode_ref(q, kc, vc, bt, t(seq), sc, start_lens=t(start), cu_seqlens_q=cu, sink_lens=t(sink))
    exp = _expected(q, kc, vc, bt, seq, qlens, start, sink, sc)
    assert (out.double() - exp).abs().max() < 1e-5


def test_multi_query_decode_empty_range_is_zero_with_lse_minus_inf():
    gen = torch.Generator().manual_seed(2)
    kc, vc, bt = env.make_paged([20], 16, 1, 64, torch.float32, gen=gen)
    q, cu = _queries([20], [3], 2, 64, torch.float32, gen)
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)  # noqa: E731
    # the window starts at 19: queries at 17 and 18 see nothing, the one at 19 sees itself
    out, lse = paged_decode_ref(q, kc, vc, bt, t([20]), 0.125, start_lens=t([19]), return_lse=True, cu_seqlens_q=cu)
    assert (out[:2] == 0).all() and torch.isinf(lse[:2]).all() and torch.isfinite(lse[2]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cascade_multi_query_equals_paged_multi_query(dtype):
    gen = torch.Generator().manual_seed(3)
    bs, Hkv, D = 16, 2, 64
    groups, prefix = [3, 1, 2], [2 * bs, 0, bs]
    seq = [2 * bs + 5, 3 * bs, 2 * bs + 1, 9, bs + 2, 2 * bs + 7]
    qlens = [5, 1, 2, 3, 2, 1]  # every query at or past its group's prefix (the scheduler's shared blocks)
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, groups=groups, prefix_lens=prefix, gen=gen)
    q, cu = _queries(seq, qlens, 4 * Hkv, D, dtype, gen)
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)  # noqa: E731
    gs = t([0, 3, 4, 6])
    sc = 1 / math.sqrt(D)
    out = cascade_decode_ref(q, kc, vc, bt, t(seq), gs, t(prefix), sc, cu_seqlens_q=cu)
    ref = paged_decode_ref(q, kc, vc, bt, t(seq), sc, cu_seqlens_q=cu)
    assert out.dtype == dtype and out.shape == q.shape
    assert env.rel_err(out, ref) < env.TOL[dtype]


# --- Triton (interpreter on CPU) vs the references -------------------------------------------------------
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton does not import")
DTYPES = env.DTYPES
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
_poison = env.poison_fixture()  # autouse: torch.empty/empty_like return NaN-filled tensors


def _i32(xs):
    return torch.tensor(xs, dtype=torch.int32, device=DEV)


def _assert_matches(out, lse, ref, ref_lse, dtype):
    assert out.dtype == ref.dtype and out.shape == ref.shape and lse.shape == ref_lse.shape
    assert env.rel_err(out, ref) < env.TOL[dtype]  # (fails on NaN)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)), "a query that sees no key must get lse -inf, and only it"
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-3
    assert (out[~fin.any(1)] == 0).all()


# (head_dim, q heads per kv head, block size, num_splits, with start_lens); BLOCK_N is 64 (D 64) or 32 (D 128).
# 12 splits > the rows' tiles (empty splits). D 128 with 3 splits: row 5's 66 keys split 32 + 32 + 2, so in
# the last split its first two queries (positions 62, 63) see no key.
MQ_CASES = [(64, 1, 16, 1, False), (64, 4, 16, 3, True), (128, 8, 32, 12, False), (128, 3, 16, 3, False),
            (64, 2, 32, None, True)]


@needs_triton  # fp16 on a GPU: head dims 64 and 128, direct output and splits, a start
@pytest.mark.parametrize("dtype,D,ratio,bs,splits,with_start", env.grid(MQ_CASES, gpu_other=[0, 1, 2]))
def test_multi_query_triton_matches_reference(D, ratio, bs, splits, with_start, dtype):
    from pacore_kernels.paged_decode import paged_decode_triton
    gen = torch.Generator().manual_seed(10)
    Hkv = 2 if ratio < 8 else 1
    # q_len 1..5 and 0 (a padding row) mixed; runs crossing block edges; a row shorter than its run
    seq = [7, 3 * bs + 2, bs + 1, 2 * bs, 5, 66, 1, 40]
    qlens = [1, 5, 3, 2, 5, 4, 1, 0]
    start = [0, bs + 3, 0, bs, 4, 0, 0, 3]  # row 4's window starts at its last query: the others see nothing
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, gen=gen)
    q, cu = _queries(seq, qlens, Hkv * ratio, D, dtype, gen)
    sc = 1 / math.sqrt(D)
    kw = dict(cu_seqlens_q=cu, start_lens=_i32(start) if with_start else None)
    out, lse = paged_decode_triton(q, kc, vc, bt, _i32(seq), sc, return_lse=True, num_splits=splits,
                                   max_query_len=5, **kw)
    ref, ref_lse = paged_decode_ref(q, kc, vc, bt, _i32(seq), sc, return_lse=True, **kw)
    _assert_matches(out, lse, ref, ref_lse, dtype)
    # the plain (no lse) entry point, and without the max_query_len hint (read from cu_seqlens_q)
    out2 = paged_decode_triton(q, kc, vc, bt, _i32(seq), sc, num_splits=splits, **kw)
    assert torch.allclose(out2.float(), out.float(), atol=1e-6, rtol=0)


@needs_triton
def test_multi_query_triton_max_query_len_is_a_bound_not_a_promise():
    # a hint below the real run length costs passes over the keys, never results
    from pacore_kernels.paged_decode import paged_decode_triton
    gen = torch.Generator().manual_seed(11)
    seq, qlens = [50, 9, 70], [7, 2, 3]
    kc, vc, bt = env.make_paged(seq, 16, 2, 64, env.DTYPE, gen=gen)
    q, cu = _queries(seq, qlens, 8, 64, env.DTYPE, gen)  # 4 q heads per kv head: a pass of 4 queries
    ref = paged_decode_ref(q, kc, vc, bt, _i32(seq), 0.125, cu_seqlens_q=cu)
    for hint in (1, 2, 7, 16):
        out = paged_decode_triton(q, kc, vc, bt, _i32(seq), 0.125, num_splits=2, cu_seqlens_q=cu, max_query_len=hint)
        assert env.rel_err(out, ref) < env.TOL[env.DTYPE], hint


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_query_per_row_through_cu_seqlens_q_equals_plain_decode(dtype):
    # q_len 1 everywhere: the multi-query path gives the plain path's outputs (the plain path itself is
    # pinned against the reference in test_kernels_paged_decode.py)
    from pacore_kernels.paged_decode import paged_decode_triton
    gen = torch.Generator().manual_seed(12)
    seq = [1, 16, 17, 43, 71]
    kc, vc, bt = env.make_paged(seq, 16, 2, 64, dtype, gen=gen)
    q, cu = _queries(seq, [1] * 5, 8, 64, dtype, gen)
    st = _i32([0, 15, 17, 19, 32])
    for splits in (1, 12):
        plain, plain_lse = paged_decode_triton(q, kc, vc, bt, _i32(seq), 0.125, start_lens=st, return_lse=True,
                                               num_splits=splits)
        multi, multi_lse = paged_decode_triton(q, kc, vc, bt, _i32(seq), 0.125, start_lens=st, return_lse=True,
                                               num_splits=splits, cu_seqlens_q=cu, max_query_len=1)
        # (one rounding apart at most: the two paths mask different tiles, and a GPU may fuse them differently)
        assert env.rel_err(multi, plain) < (1e-6 if dtype == torch.float32 else env.TOL[dtype] / 4)
        assert torch.equal(torch.isfinite(multi_lse), torch.isfinite(plain_lse))


# Sink + window (draft steps): (q_len per row, num_splits). D 128: BLOCK_N = 32, so a 40-token sink crosses a tile.
@needs_triton  # fp16 on a GPU: split, several queries per row
@pytest.mark.parametrize("dtype,qlens,splits", env.grid([([1, 1, 1, 1, 1], 1), ([1, 1, 1, 1, 1], 5),
                                                         ([3, 1, 2, 5, 1], 2)], gpu_other=[2]))
def test_sink_and_window_triton_matches_reference(qlens, splits, dtype):
    from pacore_kernels.paged_decode import paged_decode_triton
    gen = torch.Generator().manual_seed(13)
    bs, Hkv, D = 16, 2, 128
    seq = [150, 90, 40, 130, 61]
    # sink crossing a tile; window starting mid-block; sink >= start (clipped to it); no sink; no window gap
    sink = [40, 16, 30, 0, 5]
    start = [100, 37, 20, 83, 5]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, gen=gen)
    q, cu = _queries(seq, qlens, 4 * Hkv, D, dtype, gen)
    kw = dict(start_lens=_i32(start), sink_lens=_i32(sink))
    if max(qlens) > 1:
        kw |= dict(cu_seqlens_q=cu)
    else:
        q = q.contiguous()
    sc = 1 / math.sqrt(D)
    out, lse = paged_decode_triton(q, kc, vc, bt, _i32(seq), sc, return_lse=True, num_splits=splits, **kw)
    ref, ref_lse = paged_decode_ref(q, kc, vc, bt, _i32(seq), sc, return_lse=True, **kw)
    _assert_matches(out, lse, ref, ref_lse, dtype)
    # against dense fp64 attention over exactly the sink and the window
    exp = _expected(q, kc, vc, bt, seq, qlens, start, sink, sc)
    assert (out.double() - exp).abs().max() < env.TOL[dtype]


@needs_triton
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("with_sink", [False, True])
def test_multi_query_fp8_triton_matches_reference(fp8, with_sink):
    from pacore_kernels.paged_decode import paged_decode_triton
    gen = torch.Generator().manual_seed(14)
    bs, Hkv, D = 16, 2, 128
    seq, qlens = [70, 3 * bs + 2, 20, 100], [5, 3, 1, 4]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, torch.float32, gen=gen)
    kc, vc = kc.to(fp8), vc.to(fp8)
    q, cu = _queries(seq, qlens, 4 * Hkv, D, torch.float16, gen)
    kw = dict(cu_seqlens_q=cu, k_scale=0.5, v_scale=3.0)
    if with_sink:
        kw |= dict(start_lens=_i32([40, 17, 0, 60]), sink_lens=_i32([20, 16, 4, 33]))
    out, lse = paged_decode_triton(q, kc, vc, bt, _i32(seq), 0.1, return_lse=True, num_splits=3, max_query_len=5, **kw)
    ref, ref_lse = paged_decode_ref(q, kc, vc, bt, _i32(seq), 0.1, return_lse=True, **kw)
    _assert_matches(out, lse, ref, ref_lse, torch.float16)


def _cascade_batch(bs, groups, prefix_blocks, suffixes, qlens, Hkv, D, qpk, dtype, gen):
    """Groups sharing a prefix; every query at or past its group's prefix (suffix >= q_len)."""
    prefix = [p * bs for p in prefix_blocks]
    seq, i = [], 0
    for g, n in enumerate(groups):
        for _ in range(n):
            seq.append(prefix[g] + max(suffixes[i % len(suffixes)], qlens[i]))
            i += 1
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, groups=groups, prefix_lens=prefix, gen=gen)
    q, cu = _queries(seq, qlens, Hkv * qpk, D, dtype, gen)
    gs = _i32([0] + torch.tensor(groups).cumsum(0).tolist())
    return q, kc, vc, bt, _i32(seq), gs, _i32(prefix), cu


# (q heads per kv head, max BLOCK_M of the prefix stage (16: groups tiled over query rows), prefix programs,
# suffix splits)
@needs_triton  # fp16 on a GPU: prefix BLOCK_M 64 and 16
@pytest.mark.parametrize("dtype,qpk,max_m,programs,s2", env.grid([(4, 64, None, None), (2, 16, 3, 2), (8, 16, 1, 7)],
                                                                 gpu_other=[0, 1]))
def test_cascade_multi_query_triton_matches_reference(qpk, max_m, programs, s2, dtype, monkeypatch):
    import pacore_kernels.cascade_decode as cd
    monkeypatch.setattr(cd, "_MAX_BLOCK_M", max_m)
    monkeypatch.setattr(cd, "MIN_TOKENS_PER_SPLIT", 16)  # several prefix splits at test sizes
    gen = torch.Generator().manual_seed(15)
    bs, D = 16, 64
    Hkv = 2 if qpk <= 4 else 1
    groups, prefix_blocks = [3, 1, 4, 2], [2, 0, 3, 1]
    qlens = [5, 1, 2, 3, 2, 4, 1, 5, 0, 3]
    args = _cascade_batch(bs, groups, prefix_blocks, [1, 7, bs + 3, 2 * bs], qlens, Hkv, D, qpk, dtype, gen)
    q, kc, vc, bt, sl, gs, gp, cu = args
    sc = 1 / math.sqrt(D)
    out = cd.cascade_decode_triton(q, kc, vc, bt, sl, gs, gp, sc, max_group_size=4, num_programs=programs,
                                   suffix_splits=s2, cu_seqlens_q=cu, max_query_len=5)
    ref = cascade_decode_ref(q, kc, vc, bt, sl, gs, gp, sc, cu_seqlens_q=cu)
    assert out.dtype == dtype and out.shape == q.shape
    assert env.rel_err(out, ref) < env.TOL[dtype]


@needs_triton
@pytest.mark.parametrize("fp8", FP8)
def test_cascade_multi_query_padded_batch_fp8(fp8):
    # as a CUDA graph at a padded bucket runs it: 5 rows padded to 8 (rows without queries, over block 0,
    # which holds NaN: never read), groups padded (pad_groups), the bucket's bounds as hints
    from engine.worker.cuda_graphs import pad_groups
    from pacore_kernels.cascade_decode import cascade_decode_triton
    gen = torch.Generator().manual_seed(16)
    q, kc, vc, bt, sl, gs, gp, cu = _cascade_batch(16, [3, 2], [2, 1], [1, 5, 20], [4, 1, 3, 2, 5], 2, 128, 4,
                                                   torch.float32, gen)
    kc, vc, q = kc.to(fp8), vc.to(fp8), q.half()
    kw = dict(k_scale=2.0, v_scale=0.25)
    ref = cascade_decode_ref(q, kc, vc, bt, sl, gs, gp, 0.1, cu_seqlens_q=cu, **kw)
    gs_pad, gp_pad = (t.to(DEV) for t in pad_groups(gs.cpu(), gp.cpu(), 5, 8))
    cu_pad = torch.cat([cu, cu[-1:].expand(3)])
    bt_pad = torch.cat([bt, torch.zeros(3, bt.shape[1], dtype=bt.dtype, device=DEV)])
    sl_pad = torch.cat([sl, _i32([1] * 3)])
    out = cascade_decode_triton(q, kc, vc, bt_pad, sl_pad, gs_pad, gp_pad, 0.1, max_group_size=8, max_query_len=8,
                                cu_seqlens_q=cu_pad, **kw)
    assert env.rel_err(out, ref) < env.TOL[torch.float16]


@needs_triton
def test_multi_query_triton_validates():
    from pacore_kernels.cascade_decode import cascade_decode_triton
    from pacore_kernels.paged_decode import paged_decode_triton
    gen = torch.Generator().manual_seed(17)
    kc, vc, bt = env.make_paged([20, 9], 16, 2, 64, torch.float32, gen=gen)
    q, cu = _queries([20, 9], [3, 2], 4, 64, torch.float32, gen)
    sl = _i32([20, 9])
    with pytest.raises(ValueError, match="cu_seqlens_q: expected int32/int64"):
        paged_decode_triton(q, kc, vc, bt, sl, 0.1, cu_seqlens_q=cu.float())
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be \[B \+ 1\] = \[3\]"):
        paged_decode_triton(q, kc, vc, bt, sl, 0.1, cu_seqlens_q=cu[:2])
    with pytest.raises(ValueError, match="q has 5 rows for 2 sequences"):
        paged_decode_triton(q, kc, vc, bt, sl, 0.1)
    with pytest.raises(ValueError, match="max_query_len must be a host int >= 1"):
        paged_decode_triton(q, kc, vc, bt, sl, 0.1, cu_seqlens_q=cu, max_query_len=0)
    with pytest.raises(ValueError, match="max_query_len must be a host int"):
        paged_decode_triton(q, kc, vc, bt, sl, 0.1, cu_seqlens_q=cu, max_query_len=torch.tensor(3))
    with pytest.raises(ValueError, match=r"sink_lens must be \[B\] = \[2\]"):
        paged_decode_triton(q, kc, vc, bt, sl, 0.1, cu_seqlens_q=cu, sink_lens=_i32([4]))
    with pytest.raises(ValueError, match="cu_seqlens_q must be"):
        cascade_decode_triton(q, kc, vc, bt, sl, _i32([0, 1, 2]), _i32([0, 0]), 0.1, cu_seqlens_q=cu[1:])
    # no queries at all: empty outputs, nothing launched
    out, lse = paged_decode_triton(q[:0], kc, vc, bt, sl, 0.1, return_lse=True, cu_seqlens_q=_i32([0, 0, 0]))
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
