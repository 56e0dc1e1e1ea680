"""The one thread that owns the LLM: every engine call happens on it.

HTTP handlers (on the asyncio loop) hand it commands through a locked inbox and sleep on an asyncio
queue of their own; the thread posts events to that queue with ``loop.call_soon_threadsafe``. It
steps while the engine has work and waits on a condition when idle, so requests arrive and leave
between steps without ever blocking one. Past 300 lines: a Job's stream state (text, logprobs,
echo) lives beside the thread that fills it.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from engine.sample.sampling_params import SamplingParams

from .logprobs import Piece
from .text import IncrementalText

log = logging.getLogger("pacore.serve")
RATE_WINDOW_S = 10.0  # tokens/s gauges: tokens of the steps that ended in the last 10 seconds
NON_FINITE_MESSAGE = ("the model computed non-finite logits (NaN or inf) for this request, so nothing could be "
                      "sampled; the request was aborted")


# -- events, engine thread -> handler ----------------------------------------------------------
@dataclass(slots=True)
class Accepted:
    """Every prompt of the job is in the engine (a stream may start)."""


@dataclass(slots=True)
class TextReady:
    """New stream text waits in the job (Job.take_text); one event however many steps it covers."""


@dataclass(slots=True)
class ChoiceEnd:
    index: int
    text: str            # the choice's whole text, as the engine finished it (a stream's: what it still owes)
    finish_reason: str
    num_tokens: int
    logprobs: list[Piece] | None = None  # when asked: the text's tokens and their logprobs (see text)
    prompt_logprobs: list | None = None  # the engine's, when asked (not in streams)
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it


@dataclass(slots=True)
class JobDone:
    prompt_tokens: int   # each prompt once, however many choices it has
    cached_tokens: int = 0  # of those, the ones the prefix cache held


@dataclass(slots=True)
class Failed:
    status: int          # 400: the engine refused the request; 500: a failed step; 503: engine gone
    message: str
    param: str | None = None


class EngineUnavailable(RuntimeError):
    pass


@dataclass(eq=False)
class Job:
    """One HTTP request: its prompts' token ids (tokenized by the handler, off this thread), each an
    engine request whose n choices are numbered prompt * n + child, as OpenAI numbers a batch."""
    prompts: list[list[int]]
    params: SamplingParams
    stream: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    request_ids: list[str] = field(default_factory=list)
    echo: list[str] | None = None  # completions' echo: each prompt's text, which its choices begin with
    echo_only: bool = False  # echo with max_tokens 0: a choice is its prompt alone (its one token is dropped)
    cache_salt: str | None = None  # vLLM's: the prefix cache shares blocks within one salt only
    texts: dict[int, IncrementalText] = field(default_factory=dict)  # streams: per choice
    ended: set[int] = field(default_factory=set)  # streams: choices whose last chunk has gone
    echoed: set[int] = field(default_factory=set)  # streams: prompts whose echo has gone
    prompt_tokens: int = 0
    cached_tokens: int = 0
    unfinished: int = 0
    on_done: Callable[[], None] | None = None  # on the loop, once the engine holds nothing of the job
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _texts: dict[int, list[str]] = field(default_factory=dict)  # streams: text the handler has not taken
    _pieces: dict[int, list[Piece]] = field(default_factory=dict)  # streams: logprobs likewise
    _woken: bool = False  # a TextReady is queued and not yet taken

    def emit(self, event) -> None:
        """Post an event to the handler; safe from any thread, a no-op once the loop is closed."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
            if self.on_done is not None and isinstance(event, (JobDone, Failed)):
                self.loop.call_soon_threadsafe(self.on_done)
        except RuntimeError:
            pass

    @property
    def logprobs(self) -> bool:
        return self.params.logprobs is not None

    def emit_text(self, index: int, text: str, pieces: list[Piece] | None = None) -> None:
        """Add new text of choice ``index`` and its tokens' logprobs (engine thread). A reader that
        lags finds them merged: what waits for it is one TextReady, not an event per token."""
        with self._lock:
            self._texts.setdefault(index, []).append(text)
            if pieces:
                self._pieces.setdefault(index, []).extend(pieces)
            if self._woken:
                return
            self._woken = True
        self.emit(TextReady())

    def take_text(self) -> dict[int, tuple[str, list[Piece]]]:
        """Per choice, the text and logprobs added since the last call (the handler, on a TextReady).
        What was added before a ChoiceEnd was posted is taken at a TextReady queued ahead of it."""
        with self._lock:
            texts, pieces, self._texts, self._pieces, self._woken = self._texts, self._pieces, {}, {}, False
        return {index: ("".join(parts), pieces.get(index, [])) for index, parts in texts.items()}


class EngineLoop:
    """Runs ``llm`` on a thread of its own; ``submit`` and ``abort`` are safe from any thread."""

    def __init__(self, llm):
        self.llm = llm
        self._cond = threading.Condition()
        self._inbox: list[tuple[Callable[[Job], None], Job]] = []
        self._stopping = False
        self._reason = "the engine stopped"  # what close() tells the jobs still open
        self.error: BaseException | None = None  # why the thread died, if it did
        self._jobs: dict[str, Job] = {}          # engine thread only
        self._owner: dict[str, tuple[Job, int]] = {}  # engine request id -> (job, prompt index)
        self._rates_lock = threading.Lock()
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, prefill, decode tokens) per step
        self.latest_stats: dict = self._stats()  # replaced whole after every change; read by /metrics
        self.request_metrics = None  # vllm_metrics.VllmRequestMetrics: told of each step and finished request
        self._thread = threading.Thread(target=self._run, name="pacore-engine", daemon=True)

    # -- any thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(self, job: Job) -> None:
        """Queue a job; its handler hears Accepted or Failed first. EngineUnavailable if stopped."""
        self._post(self._start, job)

    def abort(self, job: Job) -> None:
        """Drop a job (its client went away) and free its blocks."""
        self._post(self._drop, job)

    def close(self, reason: str = "the engine stopped") -> None:
        """Stop the thread after its current step; jobs still open get 503 saying ``reason``."""
        with self._cond:
            if not self._stopping:
                self._reason = reason
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def rates(self) -> tuple[float, float]:
        """(prefill, decode) tokens per second over the last RATE_WINDOW_S seconds."""
        now = time.monotonic()
        with self._rates_lock:
            self._forget_before(now - RATE_WINDOW_S)
            prefill = sum(p for _, p, _ in self._recent)
            decode = sum(d for _, _, d in self._recent)
        return prefill / RATE_WINDOW_S, decode / RATE_WINDOW_S

    def _forget_before(self, start: float) -> None:  # holding _rates_lock
        while self._recent and self._recent[0][0] < start:
            self._recent.popleft()

    def _post(self, command: Callable[[Job], None], job: Job) -> None:
        with self._cond:
            if self._stopping or self.error is not None:
                raise EngineUnavailable("the engine is not running" + (f" ({self.error!r})" if self.error else ""))
            self._inbox.append((command, job))
            self._cond.notify()

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        inbox: list[tuple[Callable[[Job], None], Job]] = []
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._stopping or self.llm.has_unfinished()):
                        self._cond.wait()
                    if self._stopping:
                        break
                    inbox, self._inbox = self._inbox, []
                for command, job in inbox:
                    command(job)
                inbox = []
                if self.llm.has_unfinished():
                    self._step()
                self.latest_stats = self._stats()
        except BaseException as e:  # an engine bug: refuse new work, fail what is open
            log.exception("engine thread failed")
            self.error = e
        with self._cond:
            self._stopping = True
            inbox, self._inbox = inbox + self._inbox, []
        reason = self._reason + (f": {self.error!r}" if self.error else "")
        for job in {id(j): j for j in [*self._jobs.values(), *(job for _, job in inbox)]}.values():
            job.emit(Failed(503, reason))  # nobody may wait forever (a handler reads only its first end)

    def _start(self, job: Job) -> None:
        ids = job.prompts
        try:
            for i, prompt_ids in enumerate(ids):
                rid = f"{job.id}-{i}"
                self.llm.add_request(prompt_ids, job.params, request_id=rid, cache_salt=job.cache_salt)
                job.request_ids.append(rid)
                self._owner[rid] = (job, i)
        except ValueError as e:
            self._drop(job)
            job.emit(Failed(400, str(e)))
            return
        job.prompt_tokens = sum(len(p) for p in ids)
        job.unfinished = len(ids)
        self._jobs[job.id] = job
        if job.stream:
            tok = self.llm.tokenizer
            job.texts = {c: IncrementalText(tok, job.params.stop_strings, job.params.skip_special_tokens)
                         for c in range(len(ids) * job.params.n)}
        job.emit(Accepted())

    def _drop(self, job: Job) -> None:
        for rid in job.request_ids:
            self.llm.abort_request(rid)
            self._owner.pop(rid, None)
            if self.request_metrics is not None:
                self.request_metrics.forget(rid)
        self._jobs.pop(job.id, None)

    def _step(self) -> None:
        from engine.llm import StepError
        from engine.core.non_finite import NonFiniteLogits
        before = self.latest_stats
        try:
            outputs = self.llm.step()
        except StepError as e:  # its requests are aborted; fail their jobs, every other one goes on
            outputs = []  # what finished in the step comes with the next one
            message = (NON_FINITE_MESSAGE if isinstance(e.cause, NonFiniteLogits)
                       else f"engine step failed: {e.cause!r}")
            for rid in e.partial:
                owner = self._owner.get(rid)
                if owner is not None and owner[0].id in self._jobs:
                    self._drop(owner[0])
                    owner[0].emit(Failed(500, message))
        self.latest_stats = stats = self._stats()  # before any reply leaves: /metrics then counts its tokens
        now = time.monotonic()
        with self._rates_lock:  # pruned here too: a server nobody scrapes must not keep every step
            self._forget_before(now - RATE_WINDOW_S)
            self._recent.append((now, stats["prefill_tokens"] - before["prefill_tokens"],
                                 stats["decode_tokens"] - before["decode_tokens"]))
        if self.request_metrics is not None:
            self._observe(before, stats, outputs)
        for out in outputs:
            self._finish(out)
        for job in self._jobs.values():
            if job.stream:
                self._stream(job)

    def _observe(self, before: dict, stats: dict, outputs) -> None:
        """vLLM's step and request metrics (vllm_metrics.py), in the engine's clock."""
        m, llm = self.request_metrics, self.llm
        tokens = stats["prefill_tokens"] - before["prefill_tokens"] + stats["generated_tokens"] - before["generated_tokens"]
        running = {rid: llm.requests[rid] for rid in self._owner if rid in llm.requests}
        m.step(tokens, {rid: sum(s.num_generated for s in req.seqs) for rid, req in running.items()}, llm.clock())
        for out in outputs:
            owner = self._owner.get(out.request_id)
            if owner is not None:
                params = owner[0].params
                m.finished(out, params.n, params.max_tokens or llm.max_model_len - len(out.prompt_token_ids))

    def _finish(self, out) -> None:
        owner = self._owner.pop(out.request_id, None)
        if owner is None:  # aborted meanwhile
            return
        job, i = owner
        n = job.params.n
        if job.stream and job.echo is not None and i not in job.echoed:
            self._echo(job, i, out.prompt_logprobs)
        for o in out.outputs:
            index = i * n + o.index
            if index in job.ended:
                continue
            seen = job.texts[index].seen if job.stream else 0  # a stream has sent those tokens
            text = "" if job.echo_only else job.texts[index].rest(o.text) if job.stream else o.text
            pieces = [] if job.echo_only or not job.logprobs else [(o.token_ids[seen:], o.logprobs[seen:])]
            if job.echo is not None and not job.stream:  # a stream's echo went first (_echo)
                text = job.echo[i] + text
                pieces.insert(0, (job.prompts[i], out.prompt_logprobs))
            job.emit(ChoiceEnd(index, text, o.finish_reason, len(o.token_ids), pieces if job.logprobs else None,
                               None if job.stream else out.prompt_logprobs, o.stop_reason))
        job.cached_tokens += out.num_cached_tokens
        job.unfinished -= 1
        if job.unfinished == 0:
            del self._jobs[job.id]
            job.emit(JobDone(job.prompt_tokens, job.cached_tokens))

    def _stream(self, job: Job) -> None:
        n = job.params.n
        for i, rid in enumerate(job.request_ids):
            if rid not in self._owner:
                continue  # finished
            if job.echo is not None and i not in job.echoed:
                prompt_logprobs = self.llm.prompt_logprobs(rid) if job.logprobs else None
                if job.logprobs and prompt_logprobs is None:
                    continue  # its prompt is not computed yet, so it has no tokens either
                self._echo(job, i, prompt_logprobs)
            texts = [job.texts[i * n + child] for child in range(n)]
            seen = [t.seen for t in texts]
            logprobs = self.llm.partial_logprobs(rid, seen) if job.logprobs else [None] * n
            for child, ((tokens, reason), lp) in enumerate(zip(self.llm.new_tokens(rid, seen), logprobs)):
                index = i * n + child
                if index in job.ended:
                    continue
                pieces = [(tokens, lp)] if job.logprobs and tokens and not job.echo_only else []
                if reason is not None:
                    # Finished while its siblings run: its last chunk goes now, not when they finish. Its
                    # last token may be a stop token, so its rest comes from the engine's final text.
                    job.ended.add(index)
                    final = "" if job.echo_only else texts[child].rest(self.llm.finished_text(rid, child))
                    job.emit(ChoiceEnd(index, final, reason, texts[child].seen + len(tokens),
                                       pieces if job.logprobs else None))
                elif tokens and not job.echo_only:
                    delta = texts[child].feed(tokens)
                    if delta or pieces:
                        job.emit_text(index, delta, pieces)

    def _echo(self, job: Job, i: int, prompt_logprobs: list | None) -> None:
        """A stream's echo: prompt ``i``'s text (and logprobs) first in each of its choices."""
        job.echoed.add(i)
        pieces = [(job.prompts[i], prompt_logprobs)] if job.logprobs else []
        if job.echo[i] or pieces:
            for child in range(job.params.n):
                job.emit_text(i * job.params.n + child, job.echo[i], pieces)

    def _stats(self) -> dict:
        stats = self.llm.stats()
        stats["num_requests"] = len(self._jobs)
        return stats
