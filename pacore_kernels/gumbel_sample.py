"""Gumbel-max sampling with counter-based noise: token = argmax_i(scores[i] + g(key, i)).

Each row carries one 64-bit key; the noise of vocabulary entry i is a Gumbel variate made from
splitmix64 at key + (i + 1) * golden (the construction of engine/sample/rng.py, one counter per entry). With
scores = logits / temperature (filtered entries -inf), the argmax is a draw from the row's
distribution. A draw is a function of (scores, key) alone, so the same key gives the same token
wherever it is used: a self-drafting step that draws its draft from its own distribution q with the
key of the target's draw at that position keeps the draft exactly when both argmaxes agree
(engine/spec/self_window.py), and the chance that they do is 1 / sum_j max(p_j / p_y, q_j / q_y)
summed over y, close to speculative sampling's 1 - TV(p, q).

The uniform behind each variate is (t + 1/2) / 2**52 for the top 52 bits t of the hash: in (0, 1) by
construction (53 bits could round up to 1.0, whose noise is +inf: that entry would win whatever its
score, and a filtered one, -inf + inf, would be NaN). Its logs are float64, so the Gumbel tail is exact
to ~37 (an inverse CDF in float32 would stop near 17 and never draw tokens ~1e-7 below the top one).
"""
from __future__ import annotations

import torch

from ._utils import HAS_TRITON, check, check_same_device, require_triton, tl, triton

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def signed64(c: int) -> int:
    """The signed 64-bit integer with the bits of c in [0, 2**64) (what an int64 tensor holds)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """A logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def gumbel_noise_ref(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """float64 [N, vocab]: the Gumbel variate of each row's key at each vocabulary entry, the plain
    statement of the noise (gumbel_argmax_ref computes the same values a block at a time). int64
    arithmetic wraps modulo 2**64 on CPU and GPU alike, which is the unsigned arithmetic of splitmix64
    (tests/pacore_kernels/test_kernels_gumbel.py checks it against engine/sample/rng.py's Python integers)."""
    x = torch.arange(1, vocab + 1, dtype=torch.int64, device=keys.device).mul_(signed64(GOLDEN))
    x = x[None, :] + keys[:, None]
    x ^= _shr(x, 30)
    x *= signed64(MIX1)
    x ^= _shr(x, 27)
    x *= signed64(MIX2)
    x ^= _shr(x, 31)
    u = _shr(x, 12).to(torch.float64).add_(0.5).mul_(2.0 ** -52)
    return u.log_().neg_().log_().neg_()


# Elements per block of gumbel_argmax_ref: its three buffers stay in a core's L2 cache, where each of
# the ~20 elementwise passes is several times faster than over a [N, V] tensor in memory.
_BLOCK = 1 << 16


def gumbel_argmax_ref(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """int64 [N]: argmax over each row of scores (fp32 [N, V], -inf for excluded entries) plus its
    key's noise (gumbel_noise_ref); ties go to the lowest index. The CPU path's sampler: every value is
    computed as gumbel_noise_ref does, but only where it can win (an excluded entry never does) and a
    block at a time in reused buffers."""
    n_rows, vocab = scores.shape
    kept = torch.isfinite(scores)
    if n_rows and int(kept.sum()) * 8 < n_rows * vocab:  # filtered rows (top-k, top-p, ...): few entries
        return _sparse_argmax(scores, keys, kept)
    width = min(vocab, max(1024, _BLOCK // max(n_rows, 1)))
    rows = max(1, _BLOCK // max(width, 1))
    if n_rows > rows:  # a block of rows at a time too
        return torch.cat([gumbel_argmax_ref(scores[r:r + rows], keys[r:r + rows]) for r in range(0, n_rows, rows)])
    dev = scores.device
    golden = torch.arange(1, width + 1, dtype=torch.int64, device=dev).mul_(signed64(GOLDEN))
    x = torch.empty(n_rows, width, dtype=torch.int64, device=dev)
    t = torch.empty_like(x)
    g = torch.empty(n_rows, width, dtype=torch.float64, device=dev)
    best = torch.full((n_rows,), float("-inf"), dtype=torch.float64, device=dev)
    best_i = torch.zeros(n_rows, dtype=torch.int64, device=dev)
    for start in range(0, vocab, width):
        n = min(width, vocab - start)
        xs, ts, gs = x[:, :n], t[:, :n], g[:, :n]
        # entry start + i's counter: key + (start + i + 1) * golden, modulo 2**64
        torch.add(golden[None, :n], (keys + signed64(start * GOLDEN % (1 << 64)))[:, None], out=xs)
        _score_plus_noise(xs, ts, gs, scores[:, start:start + n])
        m, i = gs.max(dim=1)  # the first maximum, as argmax
        take = m > best  # strictly: an earlier block keeps a tie
        best = torch.where(take, m, best)
        best_i = torch.where(take, i + start, best_i)
    return best_i


def _sparse_argmax(scores: torch.Tensor, keys: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """gumbel_argmax_ref over the finite entries only (row-major order, so ties still go to the lowest
    index); a row with none draws 0, as argmax over all -inf does."""
    row, col = kept.nonzero(as_tuple=True)
    x = (col + 1).mul_(signed64(GOLDEN)).add_(keys[row])
    g = torch.empty(x.shape, dtype=torch.float64, device=x.device)
    _score_plus_noise(x, torch.empty_like(x), g, scores[row, col])
    n_rows, vocab = scores.shape
    top = torch.full((n_rows,), float("-inf"), dtype=torch.float64, device=x.device)
    top = top.scatter_reduce(0, row, g, "amax")
    first = torch.where(g == top[row], col, vocab)
    best = torch.full((n_rows,), vocab, dtype=torch.int64, device=x.device).scatter_reduce(0, row, first, "amin")
    return best.masked_fill_(best == vocab, 0)


def _score_plus_noise(x: torch.Tensor, tmp: torch.Tensor, out: torch.Tensor, scores: torch.Tensor) -> None:
    """out = scores + the Gumbel variate of counters x (int64, overwritten; tmp a buffer of its shape),
    bit for bit gumbel_noise_ref's value plus the score."""
    _xorshift_(x, 30, tmp)
    x.mul_(signed64(MIX1))
    _xorshift_(x, 27, tmp)
    x.mul_(signed64(MIX2))
    _xorshift_(x, 31, tmp)
    torch.bitwise_right_shift(x, 12, out=tmp).bitwise_and_((1 << 52) - 1)
    out.copy_(tmp).add_(0.5).mul_(2.0 ** -52).log_().neg_().log_()
    torch.sub(scores, out, out=out)  # s - log(-log u) is s + g to the bit


def _xorshift_(x: torch.Tensor, n: int, tmp: torch.Tensor) -> None:
    """x ^= x >>> n (a logical shift), in place, through ``tmp`` (x's shape)."""
    torch.bitwise_right_shift(x, n, out=tmp).bitwise_and_((1 << (64 - n)) - 1)
    x.bitwise_xor_(tmp)


# --- Triton ---------------------------------------------------------------------------------------
@triton.jit
def _gumbel_argmax_kernel(scores_ptr, keys_ptr, out_ptr, V, stride, BLOCK: tl.constexpr):
    # One program per row; the noise is made in registers, so the row's scores are read once.
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    best = tl.full((), float("-inf"), tl.float64)
    best_i = tl.full((), 0, tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        mask = offs < V
        s = tl.load(scores_ptr + row * stride + offs, mask=mask, other=float("-inf"))
        x = key + (offs + 1).to(tl.uint64) * 0x9E3779B97F4A7C15
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB
        x = x ^ (x >> 31)
        u = ((x >> 12).to(tl.float64) + 0.5) * 2.220446049250313e-16  # 2**-52: u < 1
        v = s.to(tl.float64) - tl.log(-tl.log(u))
        v = tl.where(mask, v, float("-inf"))
        m = tl.max(v, axis=0)
        i = tl.min(tl.where(v == m, offs, V), axis=0)  # the first maximum, as torch.argmax
        take = m > best  # strictly: an earlier block keeps a tie
        best_i = tl.where(take, i, best_i)
        best = tl.where(take, m, best)
    tl.store(out_ptr + row, best_i)


def gumbel_argmax_triton(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Same contract as gumbel_argmax_ref."""
    require_triton()
    check(scores.dim() == 2 and scores.stride(1) == 1, "scores must be [N, V] with contiguous rows")
    check(scores.dtype in (torch.float32, torch.float64), f"scores: unsupported dtype {scores.dtype}")
    check(keys.shape == (scores.shape[0],) and keys.dtype == torch.int64, "keys must be int64 [N]")
    check_same_device(scores=scores, keys=keys)
    out = torch.empty(scores.shape[0], dtype=torch.int64, device=scores.device)
    if scores.shape[0] > 0:
        _gumbel_argmax_kernel[(scores.shape[0],)](scores, keys.contiguous(), out, scores.shape[1],
                                                  scores.stride(0), BLOCK=2048, num_warps=8)
    return out

if not HAS_TRITON:  # only the reference is offered where triton does not import
    del gumbel_argmax_triton
