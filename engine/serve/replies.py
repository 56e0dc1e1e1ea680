"""The generation routes' replies as JSON, rendered off the event loop, and what one may hold.

A reply with log-probabilities holds an entry per token and top alternative: 64 choices echoing a
500-token prompt with the top 20 are 700k of them. Built as a pydantic object each, on the event
loop, that took ~15 s and froze every other client for as long (issue 31). So the entries are plain
dicts made straight from the engine's arrays (logprobs.py, ~1 us each), the choices are built
without validating them again (``model_construct``: every value is the server's own), and a
Renderer runs on a worker thread (``asyncio.to_thread``) one choice at a time: a choice's entries
are dropped once it is JSON, and no one serialiser call (which holds the GIL throughout) covers
more than a choice. A request that could make the server build more entries than
``--max-logprob-entries`` is refused before it runs (``logprob_entries``).
"""
from __future__ import annotations

from collections.abc import Iterable

from engine.sample.sampling_params import SamplingParams

from . import logprobs as lp
from . import protocol as api
from .engine_loop import ChoiceEnd


def logprob_entries(prompt_lens: list[int], params: SamplingParams, max_model_len: int, echo: bool,
                    prompt_copies: int) -> int:
    """The most log-probability entries a request's replies can hold: per token with logprobs, the
    chosen token and its top N, over every choice (an echoed prompt's tokens in each of its
    choices), and the asked-for ``prompt_logprobs`` ``prompt_copies`` times per prompt (completions
    send them on each choice, chat once, a stream never)."""
    total = 0
    for p in prompt_lens:
        generated = params.max_tokens if params.max_tokens is not None else max_model_len - p
        if params.logprobs is not None:
            total += params.n * (generated + (p if echo else 0)) * (params.logprobs + 1)
        if params.prompt_logprobs is not None:
            total += prompt_copies * p * (params.prompt_logprobs + 1)
    return total


class Renderer:
    """One request's JSON: its reply, or its stream's chunks. Safe on any thread (it reads the
    engine's outputs once the engine is done with them, and decodes with a thread-safe tokenizer)."""

    def __init__(self, model_name: str, texts: lp.TokenTexts, chat: bool, params: SamplingParams, rid: str,
                 created: int, prompt_logprobs: bool):
        self.model_name, self.texts, self.chat, self.params = model_name, texts, chat, params
        self.rid, self.created = rid, created
        self.prompt_logprobs = prompt_logprobs  # asked for (not only echoed): sent in their own field
        self.offsets: dict[int, int] = {}  # completions streams: per choice, the text offset its next token has

    # -- a whole reply -----------------------------------------------------------------------------
    def reply(self, ends: list[ChoiceEnd], usage: api.Usage) -> bytes:
        """The reply's JSON, its choices rendered one at a time (``ends`` in index order)."""
        if self.chat:
            head = api.ChatCompletion.model_construct(id=self.rid, created=self.created, model=self.model_name,
                                                      choices=[], usage=usage,
                                                      prompt_logprobs=self._prompt_logprobs(ends[0]))
        else:
            head = api.Completion(id=self.rid, created=self.created, model=self.model_name, choices=[], usage=usage)
        choices = ",".join(choice.model_dump_json() for choice in self._choices(ends))
        return ('{"choices":[' + choices + "]," + head.model_dump_json(exclude={"choices"})[1:]).encode()

    def _choices(self, ends: list[ChoiceEnd]) -> Iterable:
        if self.chat:
            for e in ends:
                yield api.ChatChoice.model_construct(
                    index=e.index, message=api.AssistantMessage(content=e.text),
                    logprobs=self.logprobs(e.index, e.logprobs), finish_reason=e.finish_reason,
                    stop_reason=e.stop_reason)
            return
        shared = {}  # the n choices of a prompt share its prompt logprobs: converted once
        for e in ends:
            prompt = e.index // self.params.n
            if prompt not in shared:
                shared = {prompt: self._prompt_logprobs(e)}
            yield api.CompletionChoice.model_construct(
                index=e.index, text=e.text, logprobs=self.logprobs(e.index, e.logprobs),
                finish_reason=e.finish_reason, stop_reason=e.stop_reason, prompt_logprobs=shared[prompt])

    def _prompt_logprobs(self, end: ChoiceEnd) -> lp.PromptLogprobs | None:
        # Echo asks the engine for the prompt's logprobs, and the choice's logprobs begin with them:
        # they go out in prompt_logprobs too only when the client asked for that field.
        return lp.prompt_logprobs(end.prompt_logprobs) if self.prompt_logprobs else None

    # -- a stream ------------------------------------------------------------------------------------
    def chunk(self, index: int, text: str | None, finish: str | None = None, role: bool = False,
              pieces: list[lp.Piece] | None = None, usage: api.Usage | None = None,
              stop_reason: int | str | None = None) -> str:
        """One server-sent event of choice ``index``: its new text and those tokens' logprobs (and with
        continuous_usage_stats, ``usage``: its prompt and its tokens so far, as vLLM counts them)."""
        logprobs = self.logprobs(index, pieces)
        if self.chat:
            delta = api.Delta(role="assistant" if role else None, content=text)
            c = api.ChatCompletionChunk(id=self.rid, created=self.created, model=self.model_name, choices=[
                api.ChatChunkChoice.model_construct(index=index, delta=delta, logprobs=logprobs, finish_reason=finish,
                                                    stop_reason=stop_reason)],
                usage=usage)
        else:
            c = api.Completion(id=self.rid, created=self.created, model=self.model_name, choices=[
                api.CompletionChoice.model_construct(index=index, text=text, logprobs=logprobs, finish_reason=finish,
                                                     stop_reason=stop_reason, prompt_logprobs=None)], usage=usage)
        return f"data: {c.model_dump_json()}\n\n"

    def usage_chunk(self, usage: api.Usage) -> str:
        cls = api.ChatCompletionChunk if self.chat else api.Completion
        last = cls(id=self.rid, created=self.created, model=self.model_name, choices=[], usage=usage)
        return f"data: {last.model_dump_json()}\n\n"

    # -- logprobs ------------------------------------------------------------------------------------
    def logprobs(self, index: int, pieces: list[lp.Piece] | None):
        """Choice ``index``'s ``logprobs`` for the tokens of ``pieces`` (None unless asked); a
        completions stream's text offsets go on from where its last chunk ended."""
        if pieces is None:
            return None
        if self.chat:
            return lp.chat_logprobs(pieces, self.params.logprobs, self.texts)
        logprobs, self.offsets[index] = lp.completion_logprobs(pieces, self.offsets.get(index, 0), self.texts)
        return logprobs
