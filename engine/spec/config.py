"""What ``LLM(..., speculative_config={...})`` (``--speculative-config JSON``) may say, checked once.

vLLM's keys where vLLM has them: ``method``, ``num_speculative_tokens``, ``prompt_lookup_min``,
``prompt_lookup_max``. Ours: ``lookup_siblings`` (the n-gram corpus includes the other trajectories of
the same request, PaCoRe's K siblings; default true).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

METHODS = ("ngram",)


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """Speculative decoding: each decode row carries up to ``num_speculative_tokens`` draft tokens that
    one forward verifies exactly (engine/spec/verify.py); the output is the trajectory plain decoding
    draws, token for token.

    method "ngram": a row's drafts are the tokens that followed the longest recent suffix of its
    tokens (``prompt_lookup_min`` to ``prompt_lookup_max`` tokens long) where it occurred before in
    the request's prompt, its own tokens, and (``lookup_siblings``) its siblings' tokens."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    lookup_siblings: bool = True

    @classmethod
    def from_dict(cls, raw: dict | None) -> "SpeculativeConfig | None":
        """The config a dict describes (None: no speculation); ValueError naming the key at fault."""
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, got {raw!r}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; the keys are {known}")
        if raw.get("method", "ngram") not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {list(METHODS)}, got {raw.get('method')!r}")
        cfg = cls(**raw)
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(cfg, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config: {name} must be an integer >= 1, got {value!r}")
        if cfg.prompt_lookup_min > cfg.prompt_lookup_max:
            raise ValueError(f"speculative_config: prompt_lookup_min ({cfg.prompt_lookup_min}) is above "
                             f"prompt_lookup_max ({cfg.prompt_lookup_max})")
        if not isinstance(cfg.lookup_siblings, bool):
            raise ValueError(f"speculative_config: lookup_siblings must be true or false, got {cfg.lookup_siblings!r}")
        return cfg
