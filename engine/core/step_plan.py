"""StepPlan: what one step computes, the scheduler's answer to the model runner and the sampler.

The scheduler (engine/core/scheduler.py) fills one each step; engine/worker/model_runner.py turns it into tensors,
engine/sample/sampler.py samples the rows it names, engine/core/step_shape.py and the rehearsal price it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.core.sequence import Sequence

# One sampled sequence's share of a step, what postprocess appends: (the sequence, the tokens it emits,
# several for a verified row (engine/spec/verify.py), its first entry in StepPlan.sample_seqs).
Run = tuple[Sequence, list[int], int]


def request_runs(seqs: list[Sequence]):
    """(start, end) of each run of consecutive sequences of one request."""
    i = 0
    while i < len(seqs):
        req, j = seqs[i].request, i + 1
        while j < len(seqs) and seqs[j].request is req:
            j += 1
        yield i, j
        i = j


def prefill_completes(seq: Sequence, chunk: int) -> bool:
    """Whether a prefill chunk of ``chunk`` tokens from ``seq.num_computed`` reaches the end of the
    sequence's tokens (its prompt, or all it had before a recompute): then the chunk's last row gets
    logits and is sampled. The rule's one statement: the scheduler records it in ``StepPlan.completes``
    while it plans (the model runner reads that); engine/core/step_shape.py applies it to any plan."""
    return seq.num_computed + chunk == seq.num_tokens


@dataclass(slots=True)
class ScoredSpan:
    """Positions [start, start + count) of a prefill chunk whose logits score the token after each
    (prompt logprobs, or the logprobs a resumed trajectory came without), with the top ``num_top``."""
    seq: Sequence
    start: int
    count: int
    num_top: int
    prompt: bool  # into the request's prompt logprobs, else the sequence's own


@dataclass(slots=True)
class StepPlan:
    """What one step computes; the model runner turns it into tensors."""
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, chunk length)
    completes: list[bool] = field(default_factory=list)  # per prefill chunk: prefill_completes(seq, chunk)
    decodes: list[Sequence] = field(default_factory=list)  # each request's rows contiguous
    # Cascade groups over `decodes` (CSR starts, shared prefix tokens, largest group); empty: none.
    group_starts: list[int] = field(default_factory=list)
    group_prefix_lens: list[int] = field(default_factory=list)
    max_group_size: int = 0
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) blocks, after the forward
    # Per sequence to sample, the row of the runner's logits (completed prefills, then decodes) it
    # samples from: a forked prompt's row serves the parent and its children. A decode row with drafts
    # has one entry per query (its sequence repeated), ``sample_offsets`` its positions after the
    # sequence's next one (empty when no row has drafts: all 0).
    sample_seqs: list[Sequence] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    sample_offsets: list[int] = field(default_factory=list)
    scored: list[ScoredSpan] = field(default_factory=list)  # prompt positions that get logits too
    drafts: dict[int, list[int]] = field(default_factory=dict)  # seq id -> its draft tokens (decode rows)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.prefills) + len(self.decodes) + sum(map(len, self.drafts.values()))

    @property
    def cascade(self) -> bool:
        return bool(self.group_starts)

    @property
    def kind(self) -> str:
        return "mixed" if self.prefills and self.decodes else ("decode" if self.decodes else "prefill")

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)
