"""Compaction: reduce a trajectory to the message that the next round sees (the paper's C(omega)).

The reference pipeline (stepfun-ai/PaCoRe, pacore/batch_inference/base_exp.py, ``parse_answer``)
passes on everything after the last ``</think>`` of a response's ``content``, unstripped, or the
whole content when there is none; a response whose ``content`` is empty is left out. With
PaCoRe-8B served by plain ``vllm serve`` (its README; no reasoning parser), ``content`` is the
whole generated text, so both rules apply to the raw text here.
"""
from __future__ import annotations

from dataclasses import dataclass

from .evaluate.confidence import MEASURES, Confidence

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(slots=True, frozen=True)
class Compacted:
    """A trajectory split at its last ``</think>``."""

    message: str  # after the last </think>, unstripped: what the next round sees
    reasoning: str  # before the last </think> ("" if none), without the opening <think>, stripped


def compact(text: str) -> Compacted:
    """Split a generated text into its conclusion (the message) and its reasoning."""
    head, sep, tail = text.rpartition(THINK_END)
    if not sep:
        return Compacted(message=text, reasoning="")
    reasoning = head.strip()
    # A serving stack's reasoning parser reports the reasoning without its opening tag.
    if reasoning.startswith(THINK_START):
        reasoning = reasoning[len(THINK_START):].strip()
    return Compacted(message=tail, reasoning=reasoning)


def reference_text(text: str) -> str:
    """The text a trajectory contributes as a reference: everything after its last ``</think>``,
    byte for byte (whitespace kept), or the whole text when it has none (``compact(text).message``)."""
    return compact(text).message


@dataclass(slots=True, frozen=True)
class Trajectory:
    """One generated trajectory of a round, as the results file records it."""

    index: int  # its child index in the engine request (for a round drawn from a pool: its pool index)
    text: str  # as generated: special tokens skipped, the stopping EOS left out (vLLM's ``content``)
    finish_reason: str | None = None
    tokens: int = 0  # generated tokens
    confidence: Confidence | None = None  # with --record-confidence (evaluate/confidence.py)

    @property
    def message(self) -> str:
        """What the next round's prompt holds for it (see reference_text)."""
        return reference_text(self.text)

    @property
    def passes_on(self) -> bool:
        """Whether it becomes a reference: the reference pipeline keeps a response whose content is
        non-empty, even when nothing follows its ``</think>`` (the reference is then "")."""
        return bool(self.text)

    def to_record(self) -> dict:
        """The ``round_responses`` entry: the reference pipeline's two keys, then ours.

        ``reasoning_content`` is "" because that is what the reference pipeline records under plain
        ``vllm serve`` (the reasoning stays inside ``content``, before the ``</think>``). The confidence
        measures follow ``tokens`` only when they were recorded: a record without them is as before."""
        rec = {"content": self.text, "reasoning_content": "", "index": self.index,
               "finish_reason": self.finish_reason, "tokens": self.tokens}
        if self.confidence is not None:
            rec["mean_logprob"] = self.confidence.mean_logprob
            rec["lowest_group_confidence"] = self.confidence.lowest_group_confidence
        return rec

    @classmethod
    def from_record(cls, rec: dict, index: int) -> Trajectory:
        """Back from ``to_record`` (``index`` stands in for records written without one)."""
        confidence = Confidence(*(rec.get(m) for m in MEASURES)) if any(m in rec for m in MEASURES) else None
        return cls(int(rec.get("index", index)), rec["content"], rec.get("finish_reason"), int(rec.get("tokens", 0)),
                   confidence)


def keep_last_tokens(text: str, tokenizer, cap: int) -> tuple[str, int]:
    """Shorten ``text`` to its last ``cap`` tokens; returns (text, tokens removed).

    The end is kept because the conclusion (and the boxed answer) sits at the end of a message.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= cap:
        return text, 0
    if cap <= 0:
        return "", len(ids)
    return tokenizer.decode(ids[-cap:], skip_special_tokens=False), len(ids) - cap
