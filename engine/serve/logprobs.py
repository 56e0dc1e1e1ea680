"""Log-probabilities as the OpenAI API serves them: chat's ``logprobs.content``, completions'
``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset) and vLLM's ``prompt_logprobs``.

The engine thread hands them over as pieces: (token ids, one entry per token), an entry being the
engine's ``dict[int, Logprob]`` (the chosen token first, then the top N in rank order) or None (a
prompt's first token, which nothing predicts). A choice's pieces are its echoed prompt (completions'
echo) and then its generated tokens; a stream sends them a few at a time, and rendering them in
pieces gives what rendering them at once does (``text_offset`` carries on from the last piece).
"""
from __future__ import annotations

from typing import Sequence

from pydantic import BaseModel

# JSON has no -inf (a token the filters removed, in --logprobs-mode processed_logprobs): OpenAI and
# vLLM send this floor instead.
LOGPROB_FLOOR = -9999.0

Piece = tuple[Sequence[int], Sequence]  # (token ids, their entries: dict[int, Logprob] | None)


class TopLogprob(BaseModel):
    """Chat: a token (its text and UTF-8 bytes) and its log-probability."""
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    """Chat: a generated token and the most likely tokens at its position, in rank order."""
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class CompletionLogprobs(BaseModel):
    """Completions: per token its text, its log-probability (None for a prompt's first token), the
    top N plus the chosen token as {text: logprob}, and its offset in the choice's text."""
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(BaseModel):
    """vLLM's Logprob, as its ``prompt_logprobs`` field serves it (keyed by token id)."""
    logprob: float
    rank: int | None
    decoded_token: str | None


PromptLogprobs = list[dict[int, PromptLogprob] | None]  # one per prompt token, the first None


def token_text(token_id: int, logprob, tokenizer) -> str:
    """A token's text: the engine's decoded token, else the tokenizer's, else vLLM's ``token_id:N``
    (a server without a tokenizer)."""
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id])


def _floor(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def _top(token_id: int, logprob, tokenizer) -> TopLogprob:
    text = token_text(token_id, logprob, tokenizer)
    return TopLogprob(token=text, logprob=_floor(logprob.logprob), bytes=list(text.encode("utf-8", "replace")))


def chat_logprobs(pieces: list[Piece], num_top: int, tokenizer) -> ChatLogprobs:
    """Chat's ``logprobs``: per token, the ``num_top`` most likely tokens in rank order (OpenAI's
    meaning; the chosen token heads the engine's entry whatever its rank, so it is sorted in)."""
    content = []
    for ids, entries in pieces:
        for token_id, entry in zip(ids, entries):
            chosen = _top(token_id, entry[token_id], tokenizer)
            ranked = sorted(entry.items(), key=lambda item: item[1].rank)[:num_top]
            content.append(TokenLogprob(**chosen.model_dump(),
                                        top_logprobs=[_top(t, lp, tokenizer) for t, lp in ranked]))
    return ChatLogprobs(content=content)


def completion_logprobs(pieces: list[Piece], offset: int, tokenizer) -> tuple[CompletionLogprobs, int]:
    """Completions' ``logprobs`` for the tokens of ``pieces``, the first at character ``offset``;
    returns them and the offset after the last token. Offsets add up the tokens' texts, as vLLM's."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for ids, entries in pieces:
        for token_id, entry in zip(ids, entries):
            if entry is None:
                text = token_text(token_id, None, tokenizer)
                token_logprobs.append(None)
                top_logprobs.append(None)
            else:
                text = token_text(token_id, entry[token_id], tokenizer)
                token_logprobs.append(_floor(entry[token_id].logprob))
                # The chosen token and the top N (OpenAI: "up to logprobs+1 elements").
                top_logprobs.append({token_text(t, lp, tokenizer): _floor(lp.logprob) for t, lp in entry.items()})
            tokens.append(text)
            text_offset.append(offset)
            offset += len(text)
    return CompletionLogprobs(tokens=tokens, token_logprobs=token_logprobs, top_logprobs=top_logprobs,
                              text_offset=text_offset), offset


def prompt_logprobs(entries) -> PromptLogprobs | None:
    """vLLM's ``prompt_logprobs`` field from the engine's (None when not asked)."""
    if entries is None:
        return None
    return [None if entry is None else
            {t: PromptLogprob(logprob=_floor(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token)
             for t, lp in entry.items()} for entry in entries]
