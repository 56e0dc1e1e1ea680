"""Decode with several queries per row (speculative verification) and with a sink + window (self-drafting):
the torch references against dense fp64 attention over the positions each query may see."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

from kernels.cascade_decode import cascade_decode_ref
from kernels.paged_decode import paged_decode_ref

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
