"""Counter-based random draws for seeded sampling (no generator state to save or batch)."""
from __future__ import annotations

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective scramble of a 64-bit integer."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def stream_uniform(stream: int, step: int) -> float:
    """Draw ``step`` of a seeded sequence's stream, uniform in [0, 1).

    Counter-based (splitmix64 at state stream + (step + 1) * golden), so a token depends on
    (seed, child, position) alone: not on what else is batched, on preemption, or on a restart,
    and no per-sequence generator launches a kernel per row per step.
    """
    return (mix64(stream + (step + 1) * _GOLDEN64) >> 11) * 2.0 ** -53
