from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from engine.sample.stop_strings import StopStrings

# Stop strings a request may carry: a string is found at a cost that follows the longest one, and the
# index built for them follows their characters, so both are bounded (OpenAI takes 4 strings; the
# server may lower these with --max-stop-strings / --max-stop-chars).
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request (vLLM's names and meanings).

    n: trajectories forked from the prompt (prefilled once, KV shared).
    temperature: 0 (or below 1e-5, as vLLM) means greedy. top_p in (0, 1], top_k (-1 or 0 = off, as vLLM;
    a token tied with the k-th is kept too), min_p in [0, 1]:
    min-p and top-k first, then top-p over what they keep, renormalised (vLLM's and transformers' order).
    presence_penalty, frequency_penalty in [-2, 2]: subtracted from the logit of each token the
    trajectory has generated, once (presence) or once per occurrence (frequency). repetition_penalty > 0
    (1 = off): the logit of each token in the prompt or the generated tokens is divided by it if
    positive, multiplied by it if not. logit_bias: token id -> a value added to its logit. All of them
    apply before temperature, to greedy requests too (engine/sample/penalties.py).
    max_tokens: tokens to generate per trajectory; None generates until EOS, a stop, or the
    context (max_model_len) is full, as vLLM does.
    seed: per-request seed; child i samples from a stream derived from (seed, i).
    stop: strings that end a trajectory (not included in the text), at most MAX_STOP_STRINGS of
    them with MAX_STOP_CHARS characters in all; stop_token_ids likewise, in addition to the model's
    EOS unless ignore_eos.
    min_tokens: no EOS or stop token can be drawn, and no stop string ends the trajectory, before it has
    generated this many tokens (vLLM's: their logits are -inf until then; engine/sample/penalties.py).
    include_stop_str_in_output: the stop string, or stop token's text, that ended a trajectory stays in
    its text. skip_special_tokens: leave special tokens' text out of the text (default, as vLLM).
    logprobs: None (off), or N >= 0: each generated token's log-probability and rank, with the top-N
    alternatives (engine/sample/logprobs.py; N at most the engine's max_logprobs). prompt_logprobs: the same
    for every prompt token after the first. Which distribution: the engine's logprobs_mode.
    """
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int | None = 16
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    _stop_index: StopStrings | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple, type(None))):
            raise ValueError(f"SamplingParams.stop must be a string or a list of strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, (list, tuple, type(None))):
            raise ValueError(f"SamplingParams.stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        self.stop = [s for s in (self.stop or []) if s != ""]
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise ValueError(f"SamplingParams.logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None
        self.validate()

    def validate(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be an integer >= 1, got {self.n!r}")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"SamplingParams.{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be an integer, -1 or 0 (off) or >= 1, got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"SamplingParams.min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"SamplingParams.{name} must be in [-2, 2] (0 = off), got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"SamplingParams.repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if not _is_int(token) or token < 0:
                raise ValueError(f"SamplingParams.logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
                raise ValueError(f"SamplingParams.logit_bias[{token}] must be a finite number, got {bias!r}")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1 or None (fill the context), "
                             f"got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"SamplingParams.min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"SamplingParams.min_tokens must be at most max_tokens ({self.max_tokens}), got "
                             f"{self.min_tokens}")
        for name in ("include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SamplingParams.{name} must be True or False, got {getattr(self, name)!r}")
        if self.seed is not None and not (_is_int(self.seed) and -2 ** 63 <= self.seed < 2 ** 64):
            # int64 and uint64 seeds both work; a larger one would silently alias one modulo 2**64.
            raise ValueError(f"SamplingParams.seed must be an integer in [-2**63, 2**64) or None, got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ValueError(f"SamplingParams.{name} must be None (off) or an integer >= 0 (the top "
                                 f"alternatives to return beside the chosen token), got {value!r}")
        if not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"SamplingParams.stop must be strings, got {self.stop!r}")
        check_stop(self.stop, MAX_STOP_STRINGS, MAX_STOP_CHARS, "SamplingParams.stop",
                   "the engine's MAX_STOP_STRINGS and MAX_STOP_CHARS")
        self._stop_index = None  # stop may have changed: indexed again when next needed
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"SamplingParams.stop_token_ids must be token ids (integers >= 0), "
                             f"got {self.stop_token_ids!r}")

    @property
    def stop_strings(self) -> StopStrings:
        """``stop`` indexed for search (engine/sample/stop_strings.py), built once per validation."""
        if self._stop_index is None:
            self._stop_index = StopStrings(self.stop)
        return self._stop_index

    @property
    def penalized(self) -> bool:
        """Whether a penalty, logit_bias or min_tokens changes this request's logits (engine/sample/penalties.py)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.min_tokens)

    @property
    def greedy(self) -> bool:
        # Dividing logits by a temperature this small overflows to inf/nan; its limit is argmax.
        return self.temperature < _GREEDY_BELOW


_GREEDY_BELOW = 1e-5


def check_stop(stop: list[str], max_strings: int, max_chars: int, what: str, limits: str) -> None:
    """Raise ValueError if ``stop`` has more than ``max_strings`` strings or ``max_chars`` characters
    in all; ``what`` names the field, ``limits`` what sets the limits (the engine's, or the server's flags)."""
    chars = sum(len(s) for s in stop if isinstance(s, str))
    if len(stop) > max_strings or chars > max_chars:
        raise ValueError(f"{what} has {len(stop)} strings of {chars} characters in all, beyond the limit of "
                         f"{max_strings} strings of {max_chars} characters in all ({limits}); send fewer or "
                         "shorter stop strings")


def _is_int(value: object) -> bool:
    # numpy integers count (numbers.Integral); True/False are not token counts or seeds.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
