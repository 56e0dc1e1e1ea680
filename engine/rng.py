"""Counter-based random draws for seeded sampling (no generator state to save or batch)."""
from __future__ import annotations

from kernels.gumbel_sample import GOLDEN, MIX1, MIX2, signed64  # splitmix64's constants: the sampler's noise uses them too

_MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective scramble of a 64-bit integer."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * MIX2) & _MASK64
    return x ^ (x >> 31)


def stream_key(stream: int, step: int) -> int:
    """The noise key of draw ``step`` of a seeded sequence's stream, a signed 64-bit integer
    (kernels/gumbel_sample.py makes the draw's Gumbel noise from it).

    Counter-based (splitmix64 at state stream + (step + 1) * golden), so a token depends on
    (seed, child, position) alone: not on what else is batched, on preemption, or on a restart,
    and no per-sequence generator launches a kernel per row per step.
    """
    return signed64(mix64(stream + (step + 1) * GOLDEN))
