"""Requests, their sequences (trajectories), and what the API hands back."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum, auto

from engine.rng import mix64
from engine.sampling_params import SamplingParams

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
    stream: int | None = None   # seeded requests: this child's sampling stream (engine/sampler.py)
    fork_pending: bool = False  # the request's first sequence, before the prompt is forked n ways
    row: int = -1               # row in the model runner's persistent block-table buffer

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


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    kv_blocks_saved_by_sharing: int = 0


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))

    @property
    def is_finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)

    def stream(self, index: int) -> int | None:
        """Child ``index``'s sampling stream: distinct per child, reproducible from (seed, index)."""
        if self.params.seed is None or self.params.greedy:
            return None
        return mix64(mix64(self.params.seed) + index)


# One child's progress as a later session needs it: (generated token ids, finish reason or None).
Partial = tuple[list[int], str | None]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int
    metrics: RequestMetrics
