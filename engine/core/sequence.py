"""Requests, their sequences (trajectories), and what the API hands back."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Callable

from engine.sample.logprobs import Logprob, TokenLogprobs, prompt_logprobs_list
from engine.sample.rng import mix64
from engine.sample.sampling_params import SamplingParams

_seq_ids = itertools.count()


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(slots=True, eq=False)
class Sequence:
    """One trajectory. Its KV lives in `block_table`; tokens [0, num_computed) are in the cache."""
    request: "Request"
    index: int
    token_ids: list[int]
    num_prompt_tokens: int
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # hash chain of the full blocks so far
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stream: int | None = None   # seeded requests: this child's sampling stream (engine/sample/sampler.py)
    fork_pending: bool = False  # the request's first sequence, before the prompt is forked n ways
    resumed: bool = False       # continues an earlier session's tokens, until its first admission
    row: int = -1               # row in the model runner's persistent block-table buffer
    logprobs: TokenLogprobs | None = None  # one position per generated token, when params.logprobs is set
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it (None: EOS, length)

    def __post_init__(self) -> None:
        if self.request.params.logprobs is not None and self.logprobs is None:
            self.logprobs = TokenLogprobs(self.request.params.logprobs)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def generated(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def owed_from(self) -> int:
        """The first position whose logits are still owed as logprobs (num_tokens when none is): the
        prompt's while its request's prompt logprobs are incomplete, or a resumed trajectory's tokens
        that came without their logprobs. The prefix cache may give back KV only before it, since a
        position it skips gets no logits."""
        owed = self.num_tokens
        if self.request.prompt_logprobs is not None and not self.request.prompt_logprobs_done:
            owed = len(self.request.prompt_logprobs)  # position p scores token p + 1
        if self.logprobs is not None and len(self.logprobs) < self.num_generated:
            owed = min(owed, self.num_prompt_tokens - 1 + len(self.logprobs))
        return owed


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    kv_blocks_saved_by_sharing: int = 0
    # Speculative decoding's counters for this request's rows (engine/spec/speculator.py, SpecStats's
    # meanings); zero without it
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_emitted_tokens: int = 0
    scheduled_time: float | None = None  # when its first prefill chunk was scheduled (vLLM's queue time ends)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))
    # tokens 1.. of the prompt, when params.prompt_logprobs is set: computed once, by one sequence
    prompt_logprobs: TokenLogprobs | None = None
    draft_index: object = None  # speculative decoding's per-request corpus (engine/spec/ngram.py), when on
    min_tokens_stops: tuple[int, ...] = ()  # what min_tokens holds back: the stop tokens, EOS unless ignored
    cache_root: bytes | None = None  # the prefix cache's hash-chain root: a cache_salt's digest (None: shared)

    def __post_init__(self) -> None:
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = TokenLogprobs(self.params.prompt_logprobs)

    @property
    def prompt_logprobs_done(self) -> bool:
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) >= len(self.prompt_token_ids) - 1

    @property
    def is_finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)

    def stream(self, index: int) -> int | None:
        """Child ``index``'s sampling stream: distinct per child, reproducible from (seed, index)."""
        if self.params.seed is None or self.params.greedy:
            return None
        return mix64(mix64(self.params.seed) + index)

    def child(self, index: int) -> Sequence:
        """Child ``index``'s sequence (StopIteration if it is not forked yet)."""
        return next(s for s in self.seqs if s.index == index)

    def partials(self, seen: list[int] | None = None) -> list[Partial]:
        """Per child: (its generated tokens after the first ``seen[i]``, or all of them without
        ``seen``; its finish reason or None). Children not forked yet have no tokens."""
        seqs = {s.index: s for s in self.seqs}
        out: list[Partial] = []
        for i in range(self.params.n):
            seq = seqs.get(i)
            if seq is None:
                out.append(([], None))
            else:
                start = seq.num_prompt_tokens + (seen[i] if seen is not None else 0)
                out.append((seq.token_ids[start:], seq.finish_reason))
        return out

    def partial_logprobs(self, seen: list[int] | None = None) -> list[TokenLogprobs | None]:
        """Per child: its logprobs after the first ``seen[i]`` positions (all of them without
        ``seen``); None for every child when the request did not ask, empty for one not forked yet."""
        if self.params.logprobs is None:
            return [None] * self.params.n
        seqs = {s.index: s for s in self.seqs}
        out = []
        for i in range(self.params.n):
            seq = seqs.get(i)
            if seq is None:  # not forked yet
                out.append(TokenLogprobs(self.params.logprobs))
                continue
            # never past the tokens: a step that failed between its sampling and postprocess
            out.append(seq.logprobs[seen[i] if seen is not None else 0:seq.num_generated])
        return out

    def output(self, final_text: Callable[[Sequence], str],
               decode: Callable[[int], str] | None = None) -> RequestOutput:
        """The finished request as the API hands it back, children in index order; ``decode`` (token
        id -> text) fills the logprobs' decoded_token."""
        outputs = []
        for s in sorted(self.seqs, key=lambda s: s.index):
            lp = s.logprobs
            if lp is not None:
                lp.decode = decode
            outputs.append(CompletionOutput(s.index, final_text(s), s.generated, s.finish_reason, lp,
                                            lp.cumulative_logprob if lp is not None else None, s.stop_reason))
        prompt_lp = None
        if self.prompt_logprobs is not None:
            self.prompt_logprobs.decode = decode
            prompt_lp = prompt_logprobs_list(self.prompt_logprobs)
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs,
                             self.metrics.num_cached_tokens, self.metrics, prompt_lp)


# One child's progress as a later session needs it: (generated token ids, finish reason or None).
Partial = tuple[list[int], str | None]


@dataclass(slots=True)
class CompletionOutput:
    """One trajectory. logprobs (when asked): a position per token of token_ids; cumulative_logprob
    is their sum."""
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: TokenLogprobs | None = None
    cumulative_logprob: float | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it (None: EOS, length)


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int
    metrics: RequestMetrics
    # vLLM's shape: one entry per prompt token, the first None (nothing predicts it); when asked
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
