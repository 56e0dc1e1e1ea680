"""What ``LLM(..., speculative_config={...})`` (``--speculative-config JSON``) may say, checked once.

vLLM's keys where vLLM has them: ``method``, ``num_speculative_tokens``, ``prompt_lookup_min``,
``prompt_lookup_max``. Ours: ``lookup_siblings`` (the n-gram corpus includes the other trajectories of
the same request, PaCoRe's K siblings), and for method ``self_window`` (the model drafts for itself
over a sink and a recent window of its own KV, MagicDec-style): ``window``, ``window_fraction``, ``sink``,
``selected`` (tokens of the rest's most relevant blocks a draft step reads besides), ``selection`` (how
they are chosen: Quest-style key bounds per draft step, or the last verify pass's attention, Vegas-style),
``acceptance``, ``draft_layers`` (the layers a draft step runs: self-speculative layer skipping);
and ``policy`` / ``cost_model`` (each step's draft depth chosen from the measured acceptance and the
modelled device, engine/spec/policy.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

METHODS = ("ngram", "self_window")
ACCEPTANCE = ("coupled", "rejection")
POLICIES = ("adaptive", "fixed")
SELECTIONS = ("bounds", "verify")
MAX_SPAN = 1 << 20  # the most tokens a sink or window may name (a context of 1,048,576 tokens)
_ONLY = {"ngram": {"prompt_lookup_min", "prompt_lookup_max", "lookup_siblings"},
         "self_window": {"window", "window_fraction", "sink", "selected", "selection", "acceptance", "policy",
                         "cost_model", "draft_layers"}}


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """Speculative decoding: each decode row carries up to ``num_speculative_tokens`` draft tokens that
    one forward verifies against the model's own distribution (engine/spec/verify.py).

    method "ngram": a row's drafts are the tokens that followed the longest recent suffix of its
    tokens (``prompt_lookup_min`` to ``prompt_lookup_max`` tokens long) where it occurred before in
    the request's prompt, its own tokens, and (``lookup_siblings``) its siblings' tokens.
    method "self_window": the model drafts for itself, one step per draft token, attending only to its
    first ``sink`` tokens and its last ``window`` (engine/spec/self_window.py), or with
    ``window_fraction`` f > 0 its last max(``window``, f x its context) tokens: a window that grows with the
    context, as the StreamingLLM drafter of vLLM RFC #47351's fork (its ``sparse_attn_ratio``); with
    ``selected`` > 0 (not with ``window_fraction``) also that many tokens of the blocks in between whose keys
    bound q.k highest (Quest-style bounds per block; sink, window and selected are then rounded up to whole
    blocks). ``selection`` says how those blocks are ranked: "bounds" (the default) by per-block key bounds,
    which every draft step reads (2 vectors per block and layer) and the cache keeps beside each block;
    "verify" by the attention the last verify pass paid each block (a by-product of the verify kernels: no
    bounds read, no bounds memory).
    ``acceptance``:
    "coupled" (the draft is drawn by Gumbel-max with the noise of the target's own draw at that
    position and kept while they agree: the output is token for token the trajectory without
    speculation) or "rejection" (textbook speculative sampling: kept with probability min(1, p/q), else
    drawn from norm(max(0, p - q)): the same distribution, different tokens, an acceptance a few points
    higher). ``policy``
    "adaptive" (the default) drafts, per step, the depth that maximises the expected tokens per second
    on the device ``cost_model`` describes ("h200", or a parameters JSON a GPU run wrote), 0 where
    speculation does not pay; "fixed" always drafts num_speculative_tokens. ``draft_layers`` (None: every
    layer): a draft step runs the embedding, only these decoder layers, the final norm and the LM head
    (self-speculative layer skipping, engine/spec/layer_skip.py ``kept_layers``); an integer n keeps the
    first ceil(n/2) and the last floor(n/2) layers (a middle block skipped), a list exactly the layers it
    names; the verify pass always runs every layer, so the output is unchanged."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    lookup_siblings: bool = True
    window: int = 512
    window_fraction: float = 0.0
    sink: int = 16
    selected: int = 0
    selection: str = "bounds"
    acceptance: str = "coupled"
    policy: str = "adaptive"
    cost_model: str = "h200"
    draft_layers: int | tuple[int, ...] | None = None

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
        method = raw.get("method", "ngram")
        if method not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {list(METHODS)}, got {method!r}")
        other = next(m for m in METHODS if m != method)
        misplaced = sorted(set(raw) & _ONLY[other])
        if misplaced:
            raise ValueError(f"speculative_config: {misplaced} apply to method {other!r}, not {method!r}; remove them")
        if raw.get("draft_layers") is not None:  # a JSON list becomes a tuple: the config stays hashable
            from engine.spec.layer_skip import check_draft_layers
            raw = raw | {"draft_layers": check_draft_layers(raw["draft_layers"])}
        cfg = cls(**raw)
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "window", "sink", "selected"):
            value, least = getattr(cfg, name), 0 if name in ("sink", "selected") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"speculative_config: {name} must be an integer >= {least}, got {value!r}")
        for name in ("window", "sink", "selected"):  # positions are int32 on the device: a larger span overflows every step
            if getattr(cfg, name) > MAX_SPAN:
                raise ValueError(f"speculative_config: {name}={getattr(cfg, name)} is above {MAX_SPAN} tokens (MAX_SPAN, "
                                 f"longer than any context this engine runs); give at most the model's context")
        f = cfg.window_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise ValueError(f"speculative_config: window_fraction must be a number in [0, 1] (the share of a row's "
                             f"context its draft window spans; 0: a fixed window), got {f!r}")
        if f and cfg.selected:  # the sparse tables have a fixed width (CUDA graphs); a growing window has none
            raise ValueError("speculative_config: window_fraction and selected are two draft-KV policies (a window "
                             "that grows with the context, or a fixed window plus selected blocks); give one of them")
        if cfg.selection not in SELECTIONS:
            raise ValueError(f"speculative_config: selection must be one of {list(SELECTIONS)} (the sparse draft's "
                             f"blocks by their key bounds, or by the last verify's attention), got {cfg.selection!r}")
        if cfg.selection == "verify" and not cfg.selected:
            raise ValueError("speculative_config: selection 'verify' picks the blocks of `selected` tokens, and "
                             "selected is 0; give selected > 0 (e.g. 256) or drop selection")
        if cfg.num_speculative_tokens > 15:
            raise ValueError(f"speculative_config: num_speculative_tokens={cfg.num_speculative_tokens} is above 15 "
                             "(a verify row's queries share one pass over its KV up to 16 queries)")
        if cfg.prompt_lookup_min > cfg.prompt_lookup_max:
            raise ValueError(f"speculative_config: prompt_lookup_min ({cfg.prompt_lookup_min}) is above "
                             f"prompt_lookup_max ({cfg.prompt_lookup_max})")
        if not isinstance(cfg.lookup_siblings, bool):
            raise ValueError(f"speculative_config: lookup_siblings must be true or false, got {cfg.lookup_siblings!r}")
        if cfg.policy not in POLICIES:
            raise ValueError(f"speculative_config: policy must be one of {list(POLICIES)}, got {cfg.policy!r}")
        if not isinstance(cfg.cost_model, str):
            raise ValueError(f"speculative_config: cost_model must be 'h200' or the path of a device parameters "
                             f"JSON, got {cfg.cost_model!r}")
        if cfg.method == "self_window" and cfg.policy == "adaptive":  # read now, not after the model loads
            from engine.device_model import DeviceParams

            try:
                DeviceParams.named(cfg.cost_model)
            except ValueError as e:
                raise ValueError(f"speculative_config: cost_model: {e}") from None
        if cfg.acceptance not in ACCEPTANCE:
            raise ValueError(f"speculative_config: acceptance must be one of {list(ACCEPTANCE)}, got {cfg.acceptance!r}")
        return cfg

    def window_at(self, context: int) -> int:
        """The draft window of a row of ``context`` tokens: ``window``, or ``window_fraction`` of the context
        when that is longer."""
        return max(self.window, int(self.window_fraction * context))
