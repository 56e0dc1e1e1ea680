"""Gumbel-max sampling: the noise is splitmix64 per (key, entry), the Triton kernel draws the
reference's tokens, and two distributions drawn with one key agree as often as the coupling says."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

from engine.rng import mix64
from kernels.gumbel_sample import GOLDEN, gumbel_argmax_ref, gumbel_noise_ref

DEV = env.DEVICE


def test_noise_is_splitmix64_of_each_entry_as_python_integers_compute_it():
    keys = [0, 1, -1, 2 ** 62 + 12345, -(2 ** 63), 2 ** 63 - 1]
    g = gumbel_noise_ref(torch.tensor(keys, dtype=torch.int64, device=DEV), 9).cpu()
    for r, k in enumerate(keys):
        for i in range(9):
            u = ((mix64(k % 2 ** 64 + (i + 1) * GOLDEN) >> 11) + 0.5) * 2.0 ** -53
            assert g[r, i].item() == -math.log(-math.log(u)), (k, i)


def test_noise_is_gumbel_and_reaches_its_tail():
    g = gumbel_noise_ref(torch.arange(64, dtype=torch.int64, device=DEV) * 7919, 20000).flatten().cpu()
    u = torch.exp(-torch.exp(-g))  # the Gumbel CDF: uniform if g is Gumbel
    hist = torch.histc(u, bins=20, min=0, max=1) / len(u)
    torch.testing.assert_close(hist, torch.full((20,), 0.05, dtype=torch.float64), atol=0.002, rtol=0)
    # the upper tail, where a draw of a token far below the top one lives: P(g > 10) = 1 - exp(-e**-10)
    expected = len(g) * -math.expm1(-math.exp(-10))
    assert abs(int((g > 10).sum()) - expected) < 5 * math.sqrt(expected)


def test_triton_draws_the_reference_tokens():
    pytest.importorskip("triton")
    from kernels.gumbel_sample import gumbel_argmax_triton

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(7, 5000, generator=g)
    scores[1, 40:] = float("-inf")        # a filtered row
    scores[2] = 0.0                       # all tied: the noise alone decides
    scores[3, 4097:] = 50.0               # the winner in the last, partial block
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (7,), dtype=torch.int64, generator=g)
    scores, keys = scores.to(DEV), keys.to(DEV)
    got = gumbel_argmax_triton(scores, keys)
    assert torch.equal(got, gumbel_argmax_ref(scores, keys))
    assert got[1] < 40 and got[3] >= 4097


def test_one_key_couples_two_distributions_as_often_as_the_closed_form_says():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(12, generator=g) * 1.5, 0).double()
    q = torch.softmax(torch.log(p) + torch.randn(12, generator=g) * 0.7, 0)
    n = 40000
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, (n,), dtype=torch.int64, generator=g)
    a = gumbel_argmax_ref(torch.log(p).float().expand(n, -1), keys)
    b = gumbel_argmax_ref(torch.log(q).float().expand(n, -1), keys)
    agree = (a == b).double().mean().item()
    closed = sum(1 / torch.maximum(p / p[y], q / q[y]).sum().item() for y in range(12))
    assert abs(agree - closed) < 4 * math.sqrt(closed * (1 - closed) / n)
    tv = 0.5 * (p - q).abs().sum().item()
    assert 1 - tv - 0.1 < closed <= 1 - tv  # close to speculative sampling's acceptance, never above it
    freq = torch.bincount(a, minlength=12).double() / n
    torch.testing.assert_close(freq, p, atol=0.01, rtol=0)
