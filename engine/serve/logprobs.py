"""Log-probabilities as the OpenAI API serves them: chat's ``logprobs.content``, completions'
``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset) and vLLM's ``prompt_logprobs``.

The engine thread hands them over as pieces: (token ids, their entries). The entries are the
engine's TokenLogprobs (generated tokens: the chosen token's logprob and the top N per position), or
for an echoed prompt a list with per token ``dict[int, Logprob]`` (the chosen token first, then the
top N in rank order) or None (a prompt's first token, which nothing predicts). A choice's pieces are
its echoed prompt (completions' echo) and then its generated tokens; a stream sends them a few at a
time, and rendering them in pieces gives what rendering them at once does (``text_offset`` carries
on from the last piece).

A reply may hold a million entries, so they are plain dicts and lists (TypedDicts: the response
models serialise them without validating them again), read straight from the TokenLogprobs, with
each token's text decoded once per server (TokenTexts): ~1 us per entry, against ~20 us for a
pydantic object per entry built from the engine's dicts.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from typing_extensions import TypedDict

from engine.sample.logprobs import TokenLogprobs

# JSON has no -inf (a token the filters removed, in --logprobs-mode processed_logprobs): OpenAI and
# vLLM send this floor instead.
LOGPROB_FLOOR = -9999.0

Piece = tuple[Sequence[int], Sequence]  # (token ids, their entries: TokenLogprobs, or dict[int, Logprob] | None each)


class TopLogprob(TypedDict):
    """Chat: a token (its text and UTF-8 bytes) and its log-probability."""
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    """Chat: a generated token and the most likely tokens at its position, in rank order."""
    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    content: list[TokenLogprob]


class CompletionLogprobs(TypedDict):
    """Completions: per token its text, its log-probability (None for a prompt's first token), the
    top N plus the chosen token as {text: logprob}, and its offset in the choice's text."""
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(TypedDict):
    """vLLM's Logprob, as its ``prompt_logprobs`` field serves it (keyed by token id)."""
    logprob: float
    rank: int | None
    decoded_token: str | None


PromptLogprobs = list[dict[int, PromptLogprob] | None]  # one per prompt token, the first None


class TokenTexts:
    """Each token's text and UTF-8 bytes, decoded once: a reply names the same few thousand tokens
    over and over. Thread-safe (a lost race decodes a token twice). Without a tokenizer a token
    reads ``token_id:N``, as vLLM's."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._known: dict[int, tuple[str, list[int]]] = {}

    def text(self, token_id: int) -> str:
        return (self._known.get(token_id) or self._decode(token_id))[0]

    def top(self, token_id: int, logprob: float) -> TopLogprob:
        text, utf8 = self._known.get(token_id) or self._decode(token_id)
        return {"token": text, "logprob": _floor(logprob), "bytes": utf8}

    def _decode(self, token_id: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"token_id:{token_id}"
        known = self._known[token_id] = (text, list(text.encode("utf-8", "replace")))
        return known


def _floor(value: float) -> float:
    return LOGPROB_FLOOR if value < LOGPROB_FLOOR else value  # NaN stays NaN (null in JSON)


def _positions(piece: Piece) -> Iterator[tuple[int, tuple[float, list[tuple[int, float]]] | None]]:
    """Per token of a piece: (its id, None if nothing predicts it, else (its logprob, the top N
    (id, logprob) pairs in rank order))."""
    ids, entries = piece
    if isinstance(entries, TokenLogprobs):
        for i, (token_id, logprob) in enumerate(zip(ids, entries.logprobs)):
            yield token_id, (logprob, entries.top(i))
        return
    for token_id, entry in zip(ids, entries):
        if entry is None:
            yield token_id, None
        else:  # the chosen token is first, whatever its rank; the top N follow in rank order
            ranked = sorted(((t, lp.rank, lp.logprob) for t, lp in entry.items() if t != token_id),
                            key=lambda item: item[1])
            yield token_id, (entry[token_id].logprob, [(t, logprob) for t, _, logprob in ranked])


def chat_logprobs(pieces: list[Piece], num_top: int, texts: TokenTexts) -> ChatLogprobs:
    """Chat's ``logprobs``: per token, the ``num_top`` most likely tokens in rank order (OpenAI's meaning)."""
    content = []
    for piece in pieces:
        for token_id, position in _positions(piece):
            logprob, top = position
            content.append({**texts.top(token_id, logprob),
                            "top_logprobs": [texts.top(t, lp) for t, lp in top[:num_top]]})
    return {"content": content}


def completion_logprobs(pieces: list[Piece], offset: int, texts: TokenTexts) -> tuple[CompletionLogprobs, int]:
    """Completions' ``logprobs`` for the tokens of ``pieces``, the first at character ``offset``;
    returns them and the offset after the last token. Offsets add up the tokens' texts, as vLLM's."""
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for piece in pieces:
        for token_id, position in _positions(piece):
            text = texts.text(token_id)
            if position is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
            else:
                logprob, top = position
                token_logprobs.append(_floor(logprob))
                # The chosen token and the top N (OpenAI: "up to logprobs+1 elements").
                chosen = {text: _floor(logprob)}
                chosen.update((texts.text(t), _floor(lp)) for t, lp in top if t != token_id)
                top_logprobs.append(chosen)
            tokens.append(text)
            text_offset.append(offset)
            offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}, offset


def prompt_logprobs(entries) -> PromptLogprobs | None:
    """vLLM's ``prompt_logprobs`` field from the engine's (None when not asked)."""
    if entries is None:
        return None
    return [None if entry is None else
            {t: {"logprob": _floor(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
             for t, lp in entry.items()} for entry in entries]
