"""Deterministic seeds derived from the run seed, independent of scheduling order and hashing salt."""
from __future__ import annotations

import hashlib


def derive_seed(run_seed: int, *parts: object) -> int:
    """A 63-bit seed from the run seed and labels (problem id, round, purpose).

    Deriving per problem and round (rather than drawing from one global RNG) keeps a problem's
    results identical whether it ran alone, among others, or after a resume.
    """
    key = "\x1f".join([str(run_seed), *(repr(p) for p in parts)]).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1
