"""Triton cascade decode vs the (proven) references."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

triton = pytest.importorskip("triton")
import pacore_kernels.cascade_decode as cd  # noqa: E402
from pacore_kernels.cascade_decode import cascade_decode_ref, cascade_decode_triton  # noqa: E402

DEV = env.DEVICE
_poison = env.poison_fixture()  # autouse: torch.empty/empty_like return NaN-filled tensors


def _batch(bs, groups, prefix_blocks, suffixes, Hkv, D, qpk, dtype):
    """Several groups of different sizes and prefix lengths (incl. none) in one batch; suffixes cycle over
    the given lengths (0 = empty suffix, 1 = one-token suffix, non-multiples of bs)."""
    prefix_lens = [p * bs for p in prefix_blocks]
    seq, i = [], 0
    for g, n in enumerate(groups):
        for _ in range(n):
            seq.append(max(1, prefix_lens[g] + suffixes[i % len(suffixes)]))
            i += 1
    kc, vc, bt = env.make_paged(seq, bs, Hkv, D, dtype, groups=groups, prefix_lens=prefix_lens)
    q = torch.randn(len(seq), Hkv * qpk, D, device=DEV).to(dtype)
    i32 = dict(dtype=torch.int32, device=DEV)
    gs = torch.tensor([0] + torch.tensor(groups).cumsum(0).tolist(), **i32)
    return q, kc, vc, bt, torch.tensor(seq, **i32), gs, torch.tensor(prefix_lens, **i32)


# (head_dim, q heads per kv head, block size, min prefix split tokens, prefix programs, suffix splits,
# max BLOCK_M). Small split floors cut the test prefixes into several splits; few programs make each
# walk several work items.
CASES = [(64, 1, 16, None, None, None, 64), (128, 2, 32, 16, 3, 2, 64), (64, 4, 16, 16, 1, 1, 16),
         (128, 8, 16, 16, 64, 1, 16), (64, 8, 32, 32, 2, 7, 64), (128, 4, 32, None, 5, 3, 32)]


# fp16 on a GPU: both head dims and every prefix BLOCK_M (64, 16, 32)
@pytest.mark.parametrize("dtype,D,qpk,bs,min_split,programs,s2,max_m", env.grid(CASES, gpu_other=[1, 2, 5]))
def test_cascade_decode_triton(D, qpk, bs, min_split, programs, s2, max_m, dtype, monkeypatch):
    monkeypatch.setattr(cd, "_MAX_BLOCK_M", max_m)  # 16 forces tiling groups over members
    if min_split:
        monkeypatch.setattr(cd, "MIN_TOKENS_PER_SPLIT", min_split)
    Hkv = 2 if qpk <= 2 else 1
    args = _batch(bs, [3, 1, 5, 2], [2, 0, 3, 1], [0, 1, bs + 3, 2 * bs, 5], Hkv, D, qpk, dtype)
    sc = 1 / math.sqrt(D)
    out = cascade_decode_triton(*args, sc, num_programs=programs, suffix_splits=s2)
    ref = cascade_decode_ref(*args, sc)
    assert out.dtype == dtype and out.shape == args[0].shape
    assert env.rel_err(out, ref) < env.TOL[dtype]


def test_cascade_decode_triton_one_big_group():
    # a PaCoRe-like fork: one prompt, many members, prefix longer than the suffixes, given max_group_size
    bs, D, qpk = 16, 64, 4
    args = _batch(bs, [12], [4], [1, 2, 17, 0], 1, D, qpk, env.DTYPE)
    out = cascade_decode_triton(*args, 0.125, max_group_size=12, num_programs=3)
    assert env.rel_err(out, cascade_decode_ref(*args, 0.125)) < env.TOL[env.DTYPE]


def test_cascade_padded_groups_and_upper_bound_hint():
    # The CUDA-graph decode pads the batch with empty groups and passes its bucket size as the hint.
    bs, D, qpk = 16, 64, 2
    q, kc, vc, bt, sl, gs, gp = _batch(bs, [3, 2], [2, 1], [1, 5, 0], 1, D, qpk, env.DTYPE)
    i32 = dict(dtype=torch.int32, device=DEV)
    gs_pad = torch.cat([gs, torch.full((3,), int(gs[-1]), **i32)])
    gp_pad = torch.cat([gp, torch.zeros(3, **i32)])
    ref = cascade_decode_ref(q, kc, vc, bt, sl, gs, gp, 0.125)
    assert torch.equal(cascade_decode_ref(q, kc, vc, bt, sl, gs_pad, gp_pad, 0.125), ref)
    out = cascade_decode_triton(q, kc, vc, bt, sl, gs_pad, gp_pad, 0.125, max_group_size=8)
    assert env.rel_err(out, ref) < env.TOL[env.DTYPE]


def test_cascade_decode_triton_validates():
    q, kc, vc, bt, sl, gs, gp = _batch(16, [2], [1], [1], 1, 64, 2, torch.float32)
    with pytest.raises(ValueError, match="group_starts"):
        cascade_decode_triton(q, kc, vc, bt, sl, gs[:1], gp, 0.1)
    with pytest.raises(ValueError, match="group_prefix_lens"):
        cascade_decode_triton(q, kc, vc, bt, sl, gs, gp.float(), 0.1)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])  # on a GPU fp16: head dim 128
@pytest.mark.parametrize("dtype,D,qpk,bs,min_split,programs,s2,max_m", env.grid([CASES[1], CASES[4]], gpu_other=[0]))
def test_cascade_decode_fp8_triton_matches_reference(fp8, dtype, D, qpk, bs, min_split, programs, s2, max_m,
                                                    monkeypatch):
    """FP8 caches read as stored * scale: Triton (upcast in registers) == the reference (dequantized
    in fp32), and the reference == the plain reference over the dequantized cache."""
    monkeypatch.setattr(cd, "_MAX_BLOCK_M", max_m)
    monkeypatch.setattr(cd, "MIN_TOKENS_PER_SPLIT", min_split)
    Hkv = 2 if qpk <= 2 else 1
    q, kc, vc, bt, sl, gs, gp = _batch(bs, [3, 1, 5, 2], [2, 0, 3, 1], [0, 1, bs + 3, 2 * bs, 5], Hkv, D, qpk,
                                       torch.float32)
    kc, vc, q = kc.to(fp8), vc.to(fp8), q.to(dtype)
    sc, ks, vs = 1 / math.sqrt(D), 2.0, 0.25
    out = cascade_decode_triton(q, kc, vc, bt, sl, gs, gp, sc, num_programs=programs, suffix_splits=s2,
                                k_scale=ks, v_scale=vs)
    ref = cascade_decode_ref(q, kc, vc, bt, sl, gs, gp, sc, k_scale=ks, v_scale=vs)
    assert out.dtype == dtype and env.rel_err(out, ref) < env.TOL[dtype]
    plain = cascade_decode_ref(q.float(), kc.float() * ks, vc.float() * vs, bt, sl, gs, gp, sc)
    assert env.rel_err(ref, plain) < env.TOL[dtype]
