"""Fitting a round's prompt into the context: per-reference token caps and a clear error otherwise."""
from __future__ import annotations

from dataclasses import dataclass

from .compaction import keep_last_tokens
from .config import MessageCap
from .prompts import chat_prompt_ids, round_messages


class PromptTooLong(ValueError):
    """A round's prompt cannot fit the model's context, even with its references shortened."""


@dataclass(slots=True)
class RoundPrompt:
    """A round's prompt, tokenised and checked to fit."""

    token_ids: list[int]
    max_tokens: int  # generation budget of each trajectory
    truncated_messages: int  # references shortened to fit


def _render(tokenizer, messages, refs) -> list[int]:
    return chat_prompt_ids(tokenizer, round_messages(messages, refs))


def _cap_all(tokenizer, refs: list[str], cap: int) -> tuple[list[str], int]:
    out, n = [], 0
    for ref in refs:
        text, cut = keep_last_tokens(ref, tokenizer, cap)
        out.append(text)
        n += cut
    return out, n


def fit_round_prompt(
    tokenizer,
    messages: list[dict],
    references: list[str],
    *,
    max_model_len: int,
    max_tokens: int,
    message_token_cap: MessageCap,
) -> RoundPrompt:
    """Tokenise a round's prompt so that ``len(prompt) + max_tokens <= max_model_len``.

    References are shortened (keeping their last tokens) to an explicit cap, or in "auto" mode to the
    largest equal cap that fits. Every returned prompt was measured after rendering, so the fit is
    exact rather than estimated. Raises PromptTooLong when no cap can make it fit.
    """
    room = max_model_len - max_tokens
    refs = list(references)
    truncated = 0
    if isinstance(message_token_cap, int) and refs:
        refs, truncated = _cap_all(tokenizer, refs, message_token_cap)
    ids = _render(tokenizer, messages, refs)
    if len(ids) <= room:
        return RoundPrompt(ids, max_tokens, truncated)
    full_len = len(ids)

    if message_token_cap == "auto" and refs:
        # Template + problem cost, measured with empty references; what remains is shared equally.
        overhead = len(_render(tokenizer, messages, [""] * len(refs)))
        cap = (room - overhead) // len(refs)
        ref_ids = [tokenizer.encode(r, add_special_tokens=False) for r in refs]
        cap = min(cap, max(len(x) for x in ref_ids))
        # Re-tokenising decoded text can merge or split a few tokens, so shrink until it really fits.
        while cap >= 1:
            capped, n = _cap_all(tokenizer, refs, cap)
            ids = _render(tokenizer, messages, capped)
            if len(ids) <= room:
                return RoundPrompt(ids, max_tokens, truncated + n)
            excess = len(ids) - room
            cap -= max(1, -(-excess // len(refs)))
        raise PromptTooLong(
            f"the round prompt does not fit the context even with references cut to 1 token: "
            f"problem and template alone take {overhead} tokens, max_tokens is {max_tokens}, "
            f"context is {max_model_len}"
        )
    what = "prompt" if not refs else "prompt with its references"
    hint = "" if not refs else " (use --message-token-cap auto or a smaller cap)"
    raise PromptTooLong(
        f"the {what} is {full_len} tokens; with max_tokens {max_tokens} it exceeds the context of "
        f"{max_model_len} tokens{hint}"
    )
