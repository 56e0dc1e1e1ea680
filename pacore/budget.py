"""Fitting a round's prompt into the context: the generation budget and per-reference token cuts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.chat import chat_prompt_ids

from .compaction import keep_last_tokens
from .config import MessageCap
from .prompts import round_messages

MaxTokens = int | Literal["auto"]


class PromptTooLong(ValueError):
    """A round's prompt cannot fit the model's context, even with its references shortened."""


def reserved_room(max_model_len: int) -> int:
    """Tokens that a round prompt leaves to generate when ``--max-tokens auto`` has to cut references.

    The reference pipeline never cuts a reference, so K long messages can fill the context and leave
    a trajectory no room to reason. Here references are cut (their ends kept) only as far as needed
    to leave a quarter of the context: 32,768 tokens at 131,072, above the 15k-30k average response
    length PaCoRe-8B reached in training (paper, Figure 2), while K=32 messages may still take 98k
    tokens together, so with the paper's settings the cut should rarely happen.
    """
    return max(1, max_model_len // 4)


def check_max_tokens(max_tokens: MaxTokens, max_model_len: int) -> None:
    """Refuse a fixed budget that leaves no room for any prompt, before the model runs anything."""
    if max_tokens != "auto" and max_tokens >= max_model_len:
        raise ValueError(
            f"--max-tokens {max_tokens} leaves no room for a prompt in the model's context of {max_model_len} "
            f"tokens; use --max-tokens auto (each request generates until the context is full), a value "
            f"below {max_model_len}, or a larger --max-model-len"
        )


@dataclass(slots=True)
class RoundPrompt:
    """A round's prompt, tokenised and checked to fit."""

    token_ids: list[int]
    max_tokens: int  # generation budget of each trajectory
    truncated_messages: int  # references shortened to fit
    truncated_tokens: int  # tokens those references lost


def _render(tokenizer, messages, refs: list[str] | None) -> list[int]:
    return chat_prompt_ids(tokenizer, round_messages(messages, refs or [], empty_bypasses=refs is None))


def _cap_all(tokenizer, refs: list[str], cap: int) -> tuple[list[str], int, int]:
    out, n, lost = [], 0, 0
    for ref in refs:
        text, removed = keep_last_tokens(ref, tokenizer, cap)
        out.append(text)
        n += removed > 0
        lost += removed
    return out, n, lost


def fit_round_prompt(
    tokenizer,
    messages: list[dict],
    references: list[str] | None,
    *,
    max_model_len: int,
    max_tokens: MaxTokens,
    message_token_cap: MessageCap,
) -> RoundPrompt:
    """Tokenise a round's prompt (``references`` None in round 1) and give it its generation budget.

    A fixed ``max_tokens`` N needs ``len(prompt) + N <= max_model_len``; ``"auto"`` gives each
    trajectory ``max_model_len - len(prompt)``, and with ``message_token_cap="auto"`` cuts references
    only when the prompt would leave less than ``reserved_room``. References are shortened (keeping
    their last tokens) to an explicit cap, or in "auto" mode to the largest equal cap that fits. Every
    prompt is measured after rendering, so the fit is exact. Raises PromptTooLong when it cannot fit.
    """
    auto = max_tokens == "auto"
    limit = max_model_len - (1 if auto else max_tokens)  # the longest prompt that can run at all
    target = max_model_len - reserved_room(max_model_len) if auto and message_token_cap == "auto" else limit
    refs = None if references is None else list(references)
    truncated = lost = 0
    if isinstance(message_token_cap, int) and refs:
        refs, truncated, lost = _cap_all(tokenizer, refs, message_token_cap)
    ids = _render(tokenizer, messages, refs)
    if len(ids) <= (target if refs else limit):
        return RoundPrompt(ids, max_model_len - len(ids) if auto else max_tokens, truncated, lost)
    full_len = len(ids)

    if message_token_cap == "auto" and refs:
        # Template + problem cost, measured with empty references; what remains is shared equally.
        overhead = len(_render(tokenizer, messages, [""] * len(refs)))
        cap = (target - overhead) // len(refs)
        ref_ids = [tokenizer.encode(r, add_special_tokens=False) for r in refs]
        cap = min(cap, max(len(x) for x in ref_ids))
        # Re-tokenising decoded text can merge or split a few tokens, so shrink until it really fits.
        while cap >= 1:
            capped, n, cut = _cap_all(tokenizer, refs, cap)
            ids = _render(tokenizer, messages, capped)
            if len(ids) <= target:
                return RoundPrompt(ids, max_model_len - len(ids) if auto else max_tokens, n, cut)
            excess = len(ids) - target
            cap -= max(1, -(-excess // len(refs)))
        if auto:
            left, fix = f"leave {max_model_len - target} tokens to generate", "--message-token-cap none to run it " \
                "with what the references leave"
        else:
            left, fix = f"leave max_tokens {max_tokens}", "a lower --max-tokens"
        raise PromptTooLong(
            f"the round prompt does not fit the context even with references cut to 1 token: problem and "
            f"template alone take {overhead} tokens and must {left} in the context of {max_model_len} "
            f"(use a larger --max-model-len, or {fix})"
        )
    what = "prompt" if not refs else "prompt with its references"
    hint = "" if not refs else " (use --message-token-cap auto or a smaller cap)"
    budget = "leaves no token to generate in" if auto else f"with max_tokens {max_tokens} exceeds"
    raise PromptTooLong(f"the {what} is {full_len} tokens; it {budget} the context of {max_model_len} tokens{hint}")
