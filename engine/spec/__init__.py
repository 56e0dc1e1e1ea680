"""Speculative decoding, exact: drafts from PaCoRe's own corpus, verified in one forward per step.

config.py (what may be asked), ngram.py (the drafter), speculator.py (the scheduler's seam: drafts and
their slots, counters), verify.py (which drafts a row keeps).
"""
from engine.spec.config import SpeculativeConfig

__all__ = ["SpeculativeConfig", "Speculator", "SpecStats", "accepted_runs"]


def __getattr__(name: str):
    # The rest needs torch and the engine, imported when asked for: EngineConfig (hence `pacore run`'s
    # flag check) imports engine.spec.config, which runs this file first, and must stay torch-free.
    if name in ("Speculator", "SpecStats"):
        from engine.spec import speculator
        return getattr(speculator, name)
    if name == "accepted_runs":
        from engine.spec.verify import accepted_runs
        return accepted_runs
    raise AttributeError(f"module 'engine.spec' has no attribute {name!r}")
