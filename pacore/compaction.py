"""Compaction: reduce a trajectory to the message that the next round sees."""
from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(slots=True, frozen=True)
class Compacted:
    """A trajectory split at its last ``</think>``."""

    message: str  # text after the last </think> (whole text if none), stripped
    reasoning: str  # text before the last </think> ("" if none), without the opening <think>

    def to_record(self) -> dict[str, str]:
        """The official ``round_responses`` entry."""
        return {"content": self.message, "reasoning_content": self.reasoning}


def compact(text: str) -> Compacted:
    """Split a generated text into its conclusion (the message) and its reasoning."""
    head, sep, tail = text.rpartition(THINK_END)
    if not sep:
        return Compacted(message=text.strip(), reasoning="")
    reasoning = head.strip()
    # A serving stack's reasoning parser reports the reasoning without its opening tag.
    if reasoning.startswith(THINK_START):
        reasoning = reasoning[len(THINK_START):].strip()
    return Compacted(message=tail.strip(), reasoning=reasoning)


def keep_last_tokens(text: str, tokenizer, cap: int) -> tuple[str, bool]:
    """Shorten ``text`` to its last ``cap`` tokens; returns (text, whether it was shortened).

    The end is kept because the conclusion (and the boxed answer) sits at the end of a message.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= cap:
        return text, False
    if cap <= 0:
        return "", True
    return tokenizer.decode(ids[-cap:], skip_special_tokens=False).strip(), True
