"""The torch references, proven against naive dense implementations (and HF for the pointwise ops)."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

from pacore_kernels import (cascade_decode_ref, paged_decode_ref, prefill_attention_ref, rmsnorm_ref, rope_ref,
                     silu_and_mul_ref, store_kvcache_ref)

DEV = env.DEVICE
ALL_DTYPES = [torch.float32] + env.LOW_DTYPES

# (head_dim, gqa ratio, block size) samples covering every value of each axis.
ATTN_GRID = [(64, 1, 16), (64, 2, 32), (128, 4, 16), (128, 8, 32), (64, 8, 16), (128, 1, 32)]


def _naive_lse(q, k_cache, table_row, pos, sm_scale):
    _, bs, Hkv, D = k_cache.shape
    if len(pos) == 0:
        return torch.full((q.shape[0],), float("-inf"), dtype=torch.float64)
    pos = torch.as_tensor(pos, device=q.device)
    slots = table_row[pos // bs].long() * bs + pos % bs
    k = k_cache.reshape(-1, Hkv, D)[slots].double().repeat_interleave(q.shape[0] // Hkv, dim=1)
    s = torch.einsum("hd,lhd->hl", q.double(), k) * sm_scale
    return torch.logsumexp(s, dim=-1).cpu()


def test_store_kvcache_ref():
    N, bs, Hkv, D, T = 6, 16, 2, 64, 40
    kc = torch.zeros(N, bs, Hkv, D, device=DEV)
    vc = torch.zeros(N, bs, Hkv, D, device=DEV)
    slots = torch.randperm(N * bs)[:T]
    slots[::7] = -1
    k, v = torch.randn(T, Hkv, D, device=DEV), torch.randn(T, Hkv, D, device=DEV)
    store_kvcache_ref(k, v, kc, vc, slots.to(DEV, torch.int32))
    keep = slots >= 0
    assert torch.equal(kc.view(-1, Hkv, D)[slots[keep]], k[keep.to(DEV)])
    assert torch.equal(vc.view(-1, Hkv, D)[slots[keep]], v[keep.to(DEV)])
    assert (kc.view(-1, Hkv, D).abs().sum((1, 2)) != 0).sum() == keep.sum()


@pytest.mark.parametrize("D,ratio,bs", ATTN_GRID)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_paged_decode_ref(D, ratio, bs, dtype):
    Hkv = 2
    Hq = Hkv * ratio
    seq = [1, bs, bs + 1, 3 * bs - 5, 5 * bs, 2 * bs + 7]
    start = [0, 0, bs, 3 * bs - 5, 2 * bs, bs + 3]  # includes an empty range (start == seq)
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype)
    q = torch.randn(len(seq), Hq, D, device=DEV).to(dtype)
    sc = 1 / math.sqrt(D)
    sl = torch.tensor(seq, dtype=torch.int32, device=DEV)
    st = torch.tensor(start, dtype=torch.int32, device=DEV)
    out, lse = paged_decode_ref(q, kc, vc, bt, sl, sc, start_lens=st, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape == q.shape
    for b in range(len(seq)):
        pos = list(range(start[b], seq[b]))
        want = env.naive_attention(q[b:b + 1], kc, vc, bt[b], [pos], sc)[0]
        assert env.rel_err(out[b], want) < env.TOL[dtype] or (not pos and out[b].abs().max() == 0)
        wl = _naive_lse(q[b], kc, bt[b], pos, sc)
        if pos:
            assert torch.allclose(lse[b].double().cpu(), wl, atol=1e-4, rtol=1e-4)
        else:
            assert torch.isneginf(lse[b]).all() and (out[b] == 0).all()
    # start_lens=None is the whole sequence
    full = paged_decode_ref(q, kc, vc, bt, sl, sc)
    want = paged_decode_ref(q, kc, vc, bt, sl, sc, start_lens=torch.zeros_like(sl))
    assert torch.equal(full, want)


def _cascade_case(bs, groups, prefix_blocks, suffixes):
    prefix_lens = [p * bs for p in prefix_blocks]
    seq = []
    for g, n in enumerate(groups):
        for i in range(n):
            seq.append(prefix_lens[g] + suffixes[(g + i) % len(suffixes)])
    seq = [max(1, s) for s in seq]  # a decode row always has at least its own token
    return prefix_lens, seq


@pytest.mark.parametrize("D,ratio,bs", ATTN_GRID)
def test_cascade_decode_ref_matches_paged(D, ratio, bs):
    Hkv = 2
    groups = [3, 1, 5, 2]
    prefix_lens, seq = _cascade_case(bs, groups, [2, 0, 3, 1], [0, 1, bs + 3, 2 * bs])
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, torch.float32, groups=groups, prefix_lens=prefix_lens)
    q = torch.randn(len(seq), Hkv * ratio, D, device=DEV)
    sl = torch.tensor(seq, dtype=torch.int32, device=DEV)
    gs = torch.tensor([0] + list(torch.tensor(groups).cumsum(0)), dtype=torch.int32, device=DEV)
    gp = torch.tensor(prefix_lens, dtype=torch.int32, device=DEV)
    out = cascade_decode_ref(q, kc, vc, bt, sl, gs, gp, 1 / math.sqrt(D))
    want = paged_decode_ref(q, kc, vc, bt, sl, 1 / math.sqrt(D))
    assert (out - want).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_cascade_decode_ref_dtype(dtype):
    bs, Hkv, D = 16, 2, 64
    groups = [4, 2]
    prefix_lens, seq = _cascade_case(bs, groups, [2, 4], [0, 1, 17])
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, groups=groups, prefix_lens=prefix_lens)
    q = torch.randn(len(seq), 2 * Hkv, D, device=DEV).to(dtype)
    sl = torch.tensor(seq, dtype=torch.int32, device=DEV)
    gs = torch.tensor([0, 4, 6], dtype=torch.int32, device=DEV)
    gp = torch.tensor(prefix_lens, dtype=torch.int32, device=DEV)
    out = cascade_decode_ref(q, kc, vc, bt, sl, gs, gp, 0.125)
    assert out.dtype == dtype
    for b in range(len(seq)):
        want = env.naive_attention(q[b:b + 1], kc, vc, bt[b], [list(range(seq[b]))], 0.125)[0]
        assert env.rel_err(out[b], want) < env.TOL[dtype]


@pytest.mark.parametrize("D,ratio,bs", ATTN_GRID)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_prefill_attention_ref(D, ratio, bs, dtype):
    Hkv = 2
    # (tokens in cache after the chunk, chunk length): full prefill, chunked, one token, tail chunk.
    cases = [(bs + 5, bs + 5), (3 * bs, bs), (2 * bs + 1, 1), (4 * bs - 3, bs + 9)]
    seq = [c for c, _ in cases]
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype)
    qlens = [n for _, n in cases]
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=DEV)
    q = torch.randn(sum(qlens), Hkv * ratio, D, device=DEV).to(dtype)
    sc = 1 / math.sqrt(D)
    out = prefill_attention_ref(q, kc, vc, bt, cu, torch.tensor(seq, dtype=torch.int32, device=DEV), sc)
    assert out.dtype == dtype
    for s, (ctx, n) in enumerate(cases):
        pos = [list(range(ctx - n + i + 1)) for i in range(n)]
        want = env.naive_attention(q[cu[s]:cu[s + 1]], kc, vc, bt[s], pos, sc)
        assert env.rel_err(out[cu[s]:cu[s + 1]], want) < env.TOL[dtype]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_rmsnorm_ref_matches_hf(dtype):
    LlamaRMSNorm = pytest.importorskip("transformers.models.llama.modeling_llama").LlamaRMSNorm
    H = 96
    norm = LlamaRMSNorm(H, eps=1e-5).to(device=DEV, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(H))
        x = torch.randn(7, H, device=DEV).to(dtype)
        r = torch.randn(7, H, device=DEV).to(dtype)
        assert torch.equal(rmsnorm_ref(x, norm.weight, 1e-5), norm(x))
        out, new_r = rmsnorm_ref(x, norm.weight, 1e-5, residual=r)
        assert torch.equal(new_r, r + x)
        assert torch.equal(out, norm(r + x))


def _hf_cos_sin_cache(D, max_pos, base=10000.0, scaling=1.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return inv_freq, torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("D", [64, 128])
def test_rope_ref_matches_hf(dtype, D):
    apply_rotary_pos_emb = pytest.importorskip("transformers.models.llama.modeling_llama").apply_rotary_pos_emb
    T, Hq, Hkv = 9, 4, 2
    inv_freq, cache = _hf_cos_sin_cache(D, 4096, scaling=1.3)
    pos = torch.randint(0, 4096, (T,))
    q = torch.randn(T, Hq, D).to(dtype)
    k = torch.randn(T, Hkv, D).to(dtype)
    # HF: emb = cat(freqs, freqs); cos = emb.cos() * scaling in fp32, cast to dtype. The engine's table holds
    # exactly those fp32 values (first half of cos/sin), so HF's numerics must be reproduced bit for bit.
    half = cache[pos]
    cos = torch.cat([half[:, : D // 2]] * 2, dim=-1).to(dtype)
    sin = torch.cat([half[:, D // 2:]] * 2, dim=-1).to(dtype)
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    q2, k2 = q.clone().to(DEV), k.clone().to(DEV)
    rq, rk = rope_ref(pos.to(DEV), q2, k2, cache.to(DEV))
    assert rq.data_ptr() == q2.data_ptr() and rk.data_ptr() == k2.data_ptr()
    assert torch.equal(rq.cpu(), hq[0].transpose(0, 1))
    assert torch.equal(rk.cpu(), hk[0].transpose(0, 1))
    # and the table itself is HF's inv_freq-based cos/sin
    freqs = pos.float()[:, None] * inv_freq[None, :]
    assert torch.allclose(half[:, : D // 2], freqs.cos() * 1.3, atol=1e-5)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_silu_and_mul_ref(dtype):
    x = torch.randn(5, 2 * 48, device=DEV).to(dtype)
    out = silu_and_mul_ref(x)
    assert torch.equal(out, torch.nn.functional.silu(x[:, :48]) * x[:, 48:])
    want = torch.nn.functional.silu(x[:, :48].double()) * x[:, 48:].double()
    assert env.rel_err(out, want) < env.TOL[dtype]
