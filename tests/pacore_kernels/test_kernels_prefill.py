"""Triton chunked prefill vs the (proven) reference."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

triton = pytest.importorskip("triton")
import pacore_kernels.prefill_attention as pa  # noqa: E402
from pacore_kernels.prefill_attention import prefill_attention_ref, prefill_attention_triton  # noqa: E402

DEV = env.DEVICE
DTYPES = env.DTYPES
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


@pytest.mark.parametrize("dtype,D,qpk,bs", env.grid(CASES, gpu_other=[0, 3]))  # fp16 on a GPU: both head dims
def test_prefill_attention_triton(D, qpk, bs, dtype):
    Hkv = 1 if qpk >= 4 else 2
    # full prefill (non-multiple of bs), chunk after a cached prefix, a one-token chunk, a chunk > one tile,
    # chunks after prefixes long enough for unmasked key tiles before the diagonal ones
    cases = [(bs + 5, bs + 5), (3 * bs, bs - 3), (2 * bs + 1, 1), (70, 67), (200, 40), (330, 150)]
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


def _whole_prompts(lens, Hkv, D, qpk, dtype):
    """Chunks that are whole prompts, with the chunk's own K/V (as the model hands them over)."""
    q, kc, vc, bt, cu, sl = _batch([(n, n) for n in lens], 16, Hkv, D, qpk, dtype)
    k, v = torch.empty(q.shape[0], Hkv, D, dtype=dtype, device=DEV), torch.empty(q.shape[0], Hkv, D, dtype=dtype, device=DEV)
    for s, n in enumerate(lens):
        pos = torch.arange(n, device=DEV)
        slots = bt[s, pos // 16].long() * 16 + pos % 16
        k[cu[s]:cu[s + 1]] = kc.view(-1, Hkv, D)[slots]
        v[cu[s]:cu[s + 1]] = vc.view(-1, Hkv, D)[slots]
    return (q, kc, vc, bt, cu, sl), k, v


@pytest.mark.parametrize("dtype", DTYPES)
def test_whole_prompts_through_sdpa_match_the_reference(dtype, monkeypatch):
    """Whole prompts go to SDPA where it can run them: on CPU any dtype (flash or math), on CUDA flash
    only, which has no fp32 kernel: an fp32 chunk there runs the Triton kernel, and the step's other
    layers skip SDPA (plans["prefill_whole"] None)."""
    args, k, v = _whole_prompts([37, 100, 5], 2, 64, 4, dtype)
    ref = prefill_attention_ref(*args, 0.125)
    launches = []
    real = pa._prefill_kernel
    monkeypatch.setattr(pa, "_prefill_kernel", type("K", (), {"__getitem__": lambda s, g: launches.append(g)
                                                                  or real[g]})())
    plans = {}
    out = prefill_attention_triton(*args, 0.125, work_plans=plans, k=k, v=v, sdpa=True)
    if DEV == "cpu" or dtype != torch.float32:  # SDPA ran, not the Triton kernel
        assert not launches and plans["prefill_whole"] == args[4].tolist()
    else:
        assert launches and plans["prefill_whole"] is None
        assert pa.prefill_sdpa(args[0], k, v, args[4].tolist(), 0.125) is None
    assert env.rel_err(out, ref) < env.TOL[dtype]


@pytest.mark.parametrize("tile", sorted(pa.PREFILL_TILES))
def test_every_prefill_tile_matches_the_reference(tile, monkeypatch):
    """The bf16 tiles the GPU plan times against each other (PREFILL_TILES) give the same attention."""
    monkeypatch.setattr(pa, "PREFILL_TILE", tile)
    assert pa.prefill_blocks(torch.bfloat16, 4, 128) == pa.PREFILL_TILES[tile]
    args = _batch([(40, 40), (200, 70), (97, 1)], 16, 2, 128, 4, torch.bfloat16)
    out = prefill_attention_triton(*args, 0.088)
    assert env.rel_err(out, prefill_attention_ref(*args, 0.088)) < env.TOL[torch.bfloat16]


def test_chunk_after_a_cached_prefix_never_takes_sdpa():
    q, kc, vc, bt, cu, sl = _batch([(40, 40), (3 * 16, 7)], 16, 2, 64, 2, env.DTYPE)
    k = torch.zeros(q.shape[0], 2, 64, dtype=env.DTYPE, device=DEV)  # wrong K/V: used, they would spoil the output
    plans = {}
    out = prefill_attention_triton(q, kc, vc, bt, cu, sl, 0.125, work_plans=plans, k=k, v=k, sdpa=True)
    assert plans["prefill_whole"] is None
    assert env.rel_err(out, prefill_attention_ref(q, kc, vc, bt, cu, sl, 0.125)) < env.TOL[env.DTYPE]


def test_tile_map_is_built_once_per_step(monkeypatch):
    args = _batch([(70, 67), (200, 40)], 16, 1, 64, 4, env.DTYPE)
    calls = []
    real = pa.prefill_tile_map
    monkeypatch.setattr(pa, "prefill_tile_map", lambda *a: calls.append(a) or real(*a))
    plans = {}
    first = prefill_attention_triton(*args, 0.125, work_plans=plans)
    for _ in range(2):  # the other layers of the step
        assert torch.equal(prefill_attention_triton(*args, 0.125, work_plans=plans), first)
    assert len(calls) == 1


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])  # on a GPU fp16: head dim 128
@pytest.mark.parametrize("dtype,D,qpk,bs", env.grid([CASES[1], CASES[2]], gpu_other=[0]))
def test_prefill_attention_fp8_triton_matches_reference(fp8, dtype, D, qpk, bs):
    """FP8 caches read as stored * scale: Triton (upcast in registers) == the reference, which equals the
    plain reference over the dequantized fp32 cache. Whole prompts read the cache too (no SDPA on the
    chunk's own K/V, which the cache only holds rounded)."""
    Hkv = 1 if qpk >= 4 else 2
    cases = [(bs + 5, bs + 5), (3 * bs, bs - 3), (2 * bs + 1, 1), (200, 40), (330, 150)]
    q, kc, vc, bt, cu, sl = _batch(cases, bs, Hkv, D, qpk, torch.float32)
    kc, vc, q = kc.to(fp8), vc.to(fp8), q.to(dtype)
    sc, ks, vs = 1 / math.sqrt(D), 0.5, 4.0
    k = torch.zeros(q.shape[0], Hkv, D, dtype=dtype, device=DEV)  # wrong K/V: used, they would spoil the output
    out = prefill_attention_triton(q, kc, vc, bt, cu, sl, sc, k=k, v=k, sdpa=True, k_scale=ks, v_scale=vs)
    ref = prefill_attention_ref(q, kc, vc, bt, cu, sl, sc, k_scale=ks, v_scale=vs)
    assert out.dtype == dtype and env.rel_err(out, ref) < env.TOL[dtype]
    plain = prefill_attention_ref(q.float(), kc.float() * ks, vc.float() * vs, bt, cu, sl, sc)
    assert env.rel_err(ref, plain) < (1e-5 if dtype == torch.float32 else env.TOL[dtype])
