"""Speculative decoding, exact: drafts from PaCoRe's own corpus, verified in one forward per step.

config.py (what may be asked), ngram.py (the drafter), speculator.py (the scheduler's seam: drafts and
their slots, counters), verify.py (which drafts a row keeps).
"""
from engine.spec.config import SpeculativeConfig
from engine.spec.speculator import Speculator, SpecStats
from engine.spec.verify import accepted_runs

__all__ = ["SpeculativeConfig", "Speculator", "SpecStats", "accepted_runs"]
