"""Counter-based random draws for seeded sampling (no generator state to save or batch)."""
from __future__ import annotations

from pacore_kernels.gumbel_sample import GOLDEN, MIX1, MIX2, signed64  # splitmix64's constants: the sampler's noise uses them too

_MASK64 = (1 << 64) - 1

# What a seeded stream's draws are for, besides its tokens' own (0): rejection acceptance's draft noise,
# accept draws and residual draws (engine/spec/self_window.py, verify.py), each from a stream of its own.
DRAFT, ACCEPT, RESIDUAL = 1, 2, 3


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective scramble of a 64-bit integer."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * MIX2) & _MASK64
    return x ^ (x >> 31)


def stream_key(stream: int, step: int, purpose: int = 0) -> int:
    """The noise key of draw ``step`` of a seeded sequence's stream, a signed 64-bit integer
    (pacore_kernels/gumbel_sample.py makes the draw's Gumbel noise from it); ``purpose`` (DRAFT, ACCEPT,
    RESIDUAL) takes it from a stream derived from this one instead.

    Counter-based (splitmix64 at state stream + (step + 1) * golden), so a token depends on
    (seed, child, position) alone: not on what else is batched, on preemption, or on a restart,
    and no per-sequence generator launches a kernel per row per step.
    """
    if purpose:
        stream = mix64(stream + purpose)
    return signed64(mix64(stream + (step + 1) * GOLDEN))


def uniform(key: int) -> float:
    """A uniform float64 in [0, 1) from a key's top 53 bits."""
    return ((key & _MASK64) >> 11) * 2.0 ** -53
