"""Continuous batching: which sequences run this step, with how many tokens each.

Running sequences go first (one token for a decode, the next chunk for a prefill in progress),
then waiting ones are admitted while the token budget, the sequence limit and free blocks allow.
When a running sequence needs a block and none is free, the newest running sequences are
preempted: their blocks are freed and they are recomputed later (generated tokens are kept, and
the prefix cache usually gives their prompt back for free).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from engine.block_manager import BlockManager
from engine.sequence import Sequence, Status


@dataclass(slots=True)
class ScheduledBatch:
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, chunk length)
    decodes: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.prefills) + len(self.decodes)

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 on_release: Callable[[Sequence], None] = lambda seq: None):
        self.bm = block_manager
        self.on_release = on_release  # the model runner frees the sequence's block-table row
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last is preempted first
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _slots(self, seq: Sequence) -> int:
        # A prompt about to fork reserves room for all its trajectories.
        return min(seq.params.n, self.max_num_seqs) if seq.fork_pending else 1

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free_seq(seq)
        self.on_release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        scheduled: set[int] = set()
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            remaining = seq.num_tokens - seq.num_computed
            is_decode = remaining == 1 and seq.num_generated > 0
            chunk = 1 if is_decode else min(remaining, budget)
            if chunk == 0:
                continue
            while self.bm.blocks_needed(seq, seq.num_computed + chunk) > self.bm.num_free:
                victim = next(s for s in reversed(self.running) if s.seq_id not in scheduled)
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue
            self.bm.allocate(seq, seq.num_computed + chunk)
            scheduled.add(seq.seq_id)
            budget = max(0, budget - chunk)
            if is_decode:
                batch.decodes.append(seq)
            else:
                batch.prefills.append((seq, chunk))

        slots = sum(self._slots(s) for s in self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if slots + self._slots(seq) > self.max_num_seqs and self.running:
                break
            cached = self.bm.match_prefix(seq)
            seq.num_computed = cached
            chunk = min(seq.num_tokens - cached, budget)
            if self.bm.blocks_needed(seq, cached + chunk) > self.bm.num_free:
                self.bm.free_seq(seq)
                break
            self.bm.allocate(seq, cached + chunk)
            self.waiting.popleft()
            self.prefix_hit_tokens += cached
            if seq.num_generated == 0 and seq.index == 0:
                seq.request.metrics.num_cached_tokens = cached
            seq.status = Status.RUNNING
            seq.request.shared_prefix_blocks = -1
            self.running.append(seq)
            slots += self._slots(seq)
            budget -= chunk
            batch.prefills.append((seq, chunk))
        return batch

    def finish(self, seq: Sequence, keep_cached: bool = True) -> None:
        """Take seq out of the queues for good and free its blocks (finished or aborted).

        keep_cached=False also drops the blocks it alone held from the prefix cache (a failed step
        may have left their KV half written)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.bm.free_seq(seq, keep_cached)
            self.on_release(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
