"""Speculative decoding, exact: drafts verified in one forward per step, against the model's own draws.

config.py (what may be asked), ngram.py (drafts from the prompt, the row and its siblings),
self_window.py (the model drafting over a sink + window of its KV), policy.py (how deep, per step),
speculator.py (the scheduler's seam: drafts and their slots, counters), verify.py (which drafts a row
keeps). Nothing is imported here: the engine's option check (engine/config.py) reads config.py without
torch.
"""
