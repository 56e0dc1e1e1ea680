"""Gumbel-max sampling: the noise is splitmix64 per (key, entry), the Triton kernel draws the
reference's tokens, and two distributions drawn with one key agree as often as the coupling says."""
import _triton_env as env  # noqa: F401  (must come first)

import math

import pytest
import torch

from engine.sample.rng import mix64
from pacore_kernels.gumbel_sample import GOLDEN, MIX1, MIX2, gumbel_argmax_ref, gumbel_noise_ref, signed64

DEV = env.DEVICE


def test_noise_is_splitmix64_of_each_entry_as_python_integers_compute_it():
    keys = [0, 1, -1, 2 ** 62 + 12345, -(2 ** 63), 2 ** 63 - 1]
    g = gumbel_noise_ref(torch.tensor(keys, dtype=torch.int64, device=DEV), 9).cpu()
    for r, k in enumerate(keys):
        for i in range(9):
            u = ((mix64(k % 2 ** 64 + (i + 1) * GOLDEN) >> 12) + 0.5) * 2.0 ** -52
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
    from pacore_kernels.gumbel_sample import gumbel_argmax_triton

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


def _unmix64(y: int) -> int:
    """splitmix64's finaliser inverted: mix64(_unmix64(y)) == y."""
    def unxorshift(y, s):
        x = y
        for _ in range(64 // s + 1):
            x = y ^ (x >> s)
        return x
    m = 2 ** 64
    x = unxorshift(y, 31)
    x = unxorshift(x * pow(MIX2, -1, m) % m, 27)
    return unxorshift(x * pow(MIX1, -1, m) % m, 30)


def test_the_uniform_is_below_1_so_a_filtered_token_is_never_drawn():
    # The key whose entry 3 hashes to all ones: 53 bits made u = 1.0 there, noise +inf, and entry 3 won
    # whatever its score (a filtered one: -inf + inf = NaN, which argmax picks).
    top = 2 ** 64 - 1
    assert mix64(_unmix64(top)) == top
    assert ((top >> 11) + 0.5) * 2.0 ** -53 == 1.0  # what the 53-bit uniform was here
    key = signed64((_unmix64(top) - 4 * GOLDEN) % 2 ** 64)
    keys = torch.tensor([key] * 3, dtype=torch.int64, device=DEV)
    g = gumbel_noise_ref(keys[:1], 64)
    assert torch.isfinite(g).all() and 36 < g[0, 3] < 37  # the largest variate there is, and finite
    scores = torch.zeros(3, 64, device=DEV)
    scores[0, 3] = float("-inf")  # filtered
    scores[1, 3] = -100.0         # far below the others
    scores[2] = float("-inf")     # one token kept: the finite-entries path
    scores[2, 5] = 0.0
    draws = [gumbel_argmax_ref(scores, keys), gumbel_argmax_ref(scores[2:], keys[2:])]
    try:
        from pacore_kernels.gumbel_sample import gumbel_argmax_triton
        draws.append(gumbel_argmax_triton(scores, keys))
    except ImportError:
        pass
    assert draws[1].tolist() == [5]
    for got in (draws[0], draws[-1]):
        assert got[0] != 3 and got[1] != 3 and got[2] == 5


@pytest.mark.parametrize("shape,kept", [((16, 3000), 1.0), ((5, 4000), 0.02), ((700, 150), 1.0), ((3, 10), 0.0)])
def test_the_blocked_and_sparse_draws_are_the_plain_statements(shape, kept):
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(*shape, generator=g) * 4
    scores[torch.rand(*shape, generator=g) >= kept] = float("-inf")
    scores[0, :7] = 1.0  # ties: the lowest index, as argmax
    keys = torch.randint(-2 ** 63, 2 ** 63 - 1, shape[:1], dtype=torch.int64, generator=g)
    plain = gumbel_noise_ref(keys, shape[1]).add_(scores).argmax(-1)
    assert torch.equal(gumbel_argmax_ref(scores, keys), plain)
