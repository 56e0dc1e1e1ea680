"""Scheduler: the one owner of a sequence's life, from admission to finish.

Past 300 lines: admission, preemption, fork and cascade grouping all decide one plan together. The
plan itself is engine/core/step_plan.py; when cascade attention pays, engine/core/cascade.py.

Each step, ``schedule()`` returns a StepPlan: running sequences first (one token for a decode, the
next chunk for a prefill in progress), then waiting ones admitted while the token budget, the
sequence limit and free blocks allow. When a running sequence needs a block and none is free, the
newest running sequences are preempted: their blocks are freed and they are recomputed later
(generated tokens are kept; the prefix cache usually gives their prompt back for free).
A request with n > 1 is forked when the plan completes its prompt: the children share the prompt's
full blocks and get a copy of its partial last block (copied after the forward writes it), and
every sequence that can run samples from the parent's logits row. Decode rows are grouped by
request, with the prefix each group shares, for cascade attention. With speculative decoding a
Speculator (engine/spec/) gives decode rows draft tokens to verify in the same step.
``postprocess(plan, runs)`` then advances the sequences, appends each one's tokens (several for a
verified row) up to a stop, and finishes those that stop.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from engine.core.block_manager import BlockManager, NoFreeBlocks
from engine.core.cascade import CascadePolicy, common_prefix_blocks
from engine.core.fairness import FairShare
from engine.core.sequence import Partial, Request, Sequence, Status
from engine.core.step_plan import Run, ScoredSpan, StepPlan, prefill_completes, request_runs
from engine.core.stopping import StopChecker


class Scheduler:
    def __init__(self, block_manager: BlockManager, stop_checker: StopChecker, max_num_seqs: int,
                 max_num_batched_tokens: int, cascade: CascadePolicy, enable_fork: bool = True,
                 on_release: Callable[[Sequence], None] = lambda seq: None, speculator=None,
                 on_trim: Callable[[Sequence], None] = lambda seq: None, fair: FairShare | None = None):
        # speculator: engine/spec's Speculator (drafts and their slots, acceptance counters), or None
        # fair: the step budget's and the seats' share per request (engine/core/fairness.py); None: the defaults
        self.fair = fair or FairShare.resolve(max_num_seqs, max_num_batched_tokens)
        self.bm = block_manager
        self.speculator = speculator
        self.on_trim = on_trim  # the model runner forgets the block-table entries a trim dropped
        self.stop_checker = stop_checker
        self.cascade = cascade
        self.enable_fork = enable_fork
        self.on_release = on_release  # the model runner frees the sequence's block-table row
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # Blocks kept free when admitting, for the running sequences' growth (vLLM keeps 1% too).
        self.watermark = block_manager.num_blocks // 100
        # (sequence, free blocks) of the last admission refused for room: while the cache is full, a
        # preempted 50k-token trajectory at the head of the queue is not rehashed (3000 SHA-256 of
        # its blocks in match_prefix) every step, only once blocks have been freed.
        self._refused: tuple[int, int] = (-1, 0)
        self._owed = 0  # blocks the prefills this plan leaves unfinished still need (kept from admissions)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last is preempted first
        self._shared_blocks: dict[str, int] = {}  # request id -> leading blocks its running seqs share
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.generated_tokens = 0  # tokens appended to sequences: each one's first (sampled at prefill) too

    # -- requests in and out -----------------------------------------------------------------
    def add_request(self, req: Request, resume: list[Partial] | None = None) -> None:
        """Queue a request's sequences: one that forks after its prompt, n copies without fork,
        or (resume) one per child continuing after its tokens, recomputed like a preempted one."""
        ids = req.prompt_token_ids
        if resume is not None:
            for i, (tokens, reason) in enumerate(resume):
                seq = Sequence(req, i, ids + [int(t) for t in tokens], len(ids), stream=req.stream(i), resumed=True)
                req.seqs.append(seq)
                if reason is None:
                    self.waiting.append(seq)
                else:
                    seq.status, seq.finish_reason = Status.FINISHED, reason
            return
        fork = self.enable_fork and req.params.n > 1
        for i in range(1 if self.enable_fork else req.params.n):
            seq = Sequence(req, i, list(ids), len(ids), stream=req.stream(i), fork_pending=fork)
            req.seqs.append(seq)
            self.waiting.append(seq)

    def abort(self, req: Request, keep_cached: bool = True) -> None:
        for seq in req.seqs:
            self.finish(seq, keep_cached)
        self._shared_blocks.pop(req.request_id, None)

    def finish(self, seq: Sequence, keep_cached: bool = True) -> None:
        """Take seq out of the queues for good and free its blocks (finished or aborted).

        keep_cached=False also drops the blocks it alone held from the prefix cache (a failed step
        may have left their KV half written)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self._release(seq, keep_cached)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step ----------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if self.waiting and len(self.running) > self.fair.seats:
            self._free_seats()  # before planning: a preempted sequence is in no plan
        budget = self._schedule_running(plan, self.max_num_batched_tokens)
        if self.speculator is not None and plan.decodes:
            budget = self.speculator.draft(plan, budget)  # running rows' drafts before new prompts
        budget = self._admit(plan, budget)
        if budget > 0 and plan.prefills and self.fair.prefill_chunk:
            self._top_up(plan, budget)
        self._group_decodes(plan)
        self._plan_samples(plan)
        return plan

    def postprocess(self, plan: StepPlan, runs: list[Run]) -> list[Request]:
        """Advance what the forward computed and append each run's tokens (engine/spec/verify.py: one
        per sampled sequence, several for a verified row), each checked for a stop: a run is cut in
        place after the token that stops it, so nothing past a stop is appended, counted or recorded.
        A decode row's computed tokens then advance by what it kept, and the blocks only its rejected
        drafts used go back. Returns the requests that finished in this step."""
        for seq, chunk in plan.prefills:
            seq.num_computed += chunk
            self.prefill_tokens += chunk
        stopped: list[tuple[Sequence, str]] = []
        kept: dict[int, int] = {}
        check = self.stop_checker.check
        for seq, run, _ in runs:
            n = 0
            for token in run:
                seq.token_ids.append(token)
                n += 1
                reason = check(seq)
                if reason is not None:
                    stopped.append((seq, reason))
                    break
            if n < len(run):
                del run[n:]
            kept[seq.seq_id] = n
            self.generated_tokens += n
        bm, drafts = self.bm, plan.drafts
        for seq in plan.decodes:
            n = kept[seq.seq_id]
            seq.num_computed += n  # its last token and the drafts it kept: their K/V are written
            self.decode_tokens += n
            bm.publish(seq, seq.num_computed)  # blocks those tokens filled
            draft = drafts.get(seq.seq_id) if drafts else None
            if draft:
                bm.trim(seq, seq.num_computed)
                self.on_trim(seq)
                self.speculator.count(seq, draft, _matched(draft, seq.token_ids, n), n)
        for seq, reason in stopped:
            seq.finish_reason = reason
            self.finish(seq)
        # Once per request, not per finished sequence: checking each of n siblings would cost n^2.
        return [req for req in dict.fromkeys(seq.request for seq, _ in stopped) if req.is_finished]

    def _schedule_running(self, plan: StepPlan, budget: int) -> int:
        scheduled: set[int] = set()
        bs = self.bm.block_size
        self._owed = 0
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            num_tokens = len(seq.token_ids)
            remaining = num_tokens - seq.num_computed
            is_decode = remaining == 1 and num_tokens > seq.num_prompt_tokens
            if is_decode and seq.num_computed < len(seq.block_table) * bs:
                # The new token's slot is in a block it holds (15 decode steps in 16): nothing to
                # allocate or preempt, only a block it fills to publish. The common case at batch
                # 256 stays a few attribute reads.
                if (seq.num_computed + 1) % bs == 0:
                    self.bm.publish(seq, seq.num_computed + 1)
                scheduled.add(seq.seq_id)
                budget = max(0, budget - 1)
                plan.decodes.append(seq)
                continue
            chunk = 1 if is_decode else self.fair.first_chunk(remaining, budget)
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
                plan.decodes.append(seq)
            else:
                plan.prefills.append((seq, chunk))
                self._owed += self.bm.blocks_needed(seq, num_tokens)
        return budget

    def _admit(self, plan: StepPlan, budget: int) -> int:
        if not self.waiting or budget <= 0:
            return budget  # the common decode step: nothing to count the running sequences for
        held = self._held()
        slots = sum(held.values())
        for seq in self.fair.admission_order(self.waiting, held):
            if budget <= 0:
                break
            if slots + self._slots(seq) > self.max_num_seqs and self.running:
                break
            # Free blocks the unfinished prefills do not still need (room to admit into).
            if self._refused[0] == seq.seq_id and self.bm.num_free - self._owed <= self._refused[1]:
                break  # refused for room, and no block was freed since: matching again would only rehash it
            if plan.prefills and self._rides(seq, plan):
                continue
            cached = self.bm.match_prefix(seq, seq.owed_from())
            seq.num_computed = cached
            chunk = self.fair.first_chunk(seq.num_tokens - cached, budget)
            # Admit only a sequence whose whole prefill fits, with room left to grow: one admitted
            # for its first chunk into a nearly full cache is preempted before its prefill ends,
            # and recomputed again and again (at PaCoRe-8B's shape: half the generated tokens).
            whole = self.bm.blocks_needed(seq, seq.num_tokens) + (self.watermark if self.running else 0)
            if max(whole, self.bm.blocks_needed(seq, cached + chunk)) > self.bm.num_free - self._owed:
                self.bm.free_seq(seq)
                self._refused = (seq.seq_id, self.bm.num_free - self._owed)
                break
            self.bm.allocate(seq, cached + chunk)
            if seq is self.waiting[0]:
                self.waiting.popleft()
            else:
                self.waiting.remove(seq)
            self.prefix_hit_tokens += cached
            if seq.resumed:
                self._resumed_sharing(seq, cached)
            elif seq.num_generated == 0 and seq.index == 0:
                seq.request.metrics.num_cached_tokens = cached
            self._run(seq)
            held[seq.request] = held.get(seq.request, 0) + self._slots(seq)
            slots += self._slots(seq)
            budget -= chunk
            self._owed += self.bm.blocks_needed(seq, seq.num_tokens)
            plan.prefills.append((seq, chunk))
        return budget

    def _rides(self, seq: Sequence, plan: StepPlan) -> bool:
        """Whether seq's tokens run on, the same, past where a prefill this step leaves unfinished
        stops: that prefill computes them later, so seq waits to find them in the prefix cache instead
        of computing them too (K identical prompts sent together are prefilled once)."""
        for other, chunk in plan.prefills:
            end = other.num_computed + chunk
            if end < other.num_tokens and seq.num_tokens > end:
                stop = min(seq.num_tokens, other.num_tokens, end + self.bm.block_size)
                if seq.token_ids[:stop] == other.token_ids[:stop]:
                    return True
        return False

    def _top_up(self, plan: StepPlan, budget: int) -> None:
        """Extend the prefill chunks the first share capped, in plan order (running ones first), with
        the budget it left, as far as free blocks allow: a prefill alone gets the whole step."""
        bs = self.bm.block_size
        for i, (seq, chunk) in enumerate(plan.prefills):
            end = seq.num_computed + chunk
            more = min(seq.num_tokens - end, budget, (len(seq.block_table) + self.bm.num_free) * bs - end)
            if more > 0:
                self.bm.allocate(seq, end + more)
                plan.prefills[i] = (seq, chunk + more)
                budget -= more
                if budget == 0:
                    break

    def _held(self) -> dict[Request, int]:
        """Seats each request holds (a prompt about to fork holds its group's)."""
        held: dict[Request, int] = {}
        for s in self.running:
            held[s.request] = held.get(s.request, 0) + self._slots(s)
        return held

    def _free_seats(self) -> None:
        """Preempt the newest decoding sequences of a request over its share of seats, when that lets
        the first waiting request under its share run (engine/core/fairness.py)."""
        held = self._held()
        newcomer = next((s for s in self.waiting if self.fair.under_share(s, held)), None)
        if newcomer is None:
            return
        free = self.max_num_seqs - sum(held.values())
        for victim in self.fair.seats_to_free(newcomer, self._slots(newcomer), free, self.running, held):
            self._preempt(victim)

    def _slots(self, seq: Sequence) -> int:
        # A prompt about to fork reserves room for all its trajectories.
        return min(seq.params.n, self.max_num_seqs) if seq.fork_pending else 1

    def _run(self, seq: Sequence) -> None:
        seq.status = Status.RUNNING
        self.running.append(seq)
        self._shared_blocks.pop(seq.request.request_id, None)

    def _release(self, seq: Sequence, keep_cached: bool = True) -> None:
        self.bm.free_seq(seq, keep_cached)
        self.on_release(seq)
        self._shared_blocks.pop(seq.request.request_id, None)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _plan_samples(self, plan: StepPlan) -> None:
        row = 0
        plan.completes = [prefill_completes(seq, chunk) for seq, chunk in plan.prefills]
        for (seq, _), completes in zip(plan.prefills, plan.completes):
            if completes:
                group = self._fork(seq, plan) if seq.fork_pending else [seq]
                plan.sample_seqs.extend(group)
                plan.sample_rows.extend([row] * len(group))
                row += 1
        if not plan.drafts:
            plan.sample_seqs.extend(plan.decodes)
            plan.sample_rows.extend(range(row, row + len(plan.decodes)))
        else:  # a verified row samples each of its queries' positions
            plan.sample_offsets = [0] * len(plan.sample_seqs)
            for seq in plan.decodes:
                q = 1 + len(plan.drafts.get(seq.seq_id, ()))
                plan.sample_seqs.extend([seq] * q)
                plan.sample_rows.extend(range(row, row + q))
                plan.sample_offsets.extend(range(q))
                row += q
        self._plan_scored(plan)

    @staticmethod
    def _plan_scored(plan: StepPlan) -> None:
        """The chunk positions whose logprobs are owed (Sequence.owed_from): a request's prompt by
        one sequence only (the first to reach each position), a resumed trajectory's own tokens."""
        claimed: dict[int, int] = {}  # id(request) -> prompt positions claimed in this step
        for seq, chunk in plan.prefills:
            start, end = seq.num_computed, seq.num_computed + chunk
            req, p = seq.request, seq.num_prompt_tokens
            if req.prompt_logprobs is not None:
                have = claimed.get(id(req), len(req.prompt_logprobs))  # the next position owed
                hi = min(end, p - 1)
                if start <= have < hi:  # this chunk reaches it (a chunk past it would leave a gap)
                    plan.scored.append(ScoredSpan(seq, have, hi - have, req.params.prompt_logprobs, True))
                    claimed[id(req)] = hi
            if seq.logprobs is not None and seq.num_generated:
                lo = max(start, p - 1 + len(seq.logprobs))
                hi = min(end, seq.num_tokens - 1)
                if lo < hi:
                    plan.scored.append(ScoredSpan(seq, lo, hi - lo, req.params.logprobs, False))

    def _resumed_sharing(self, seq: Sequence, cached: int) -> None:
        """A resumed request's children are recomputed, not forked, and share the prompt through the prefix
        cache: its first child's prompt hit is the request's cached tokens, and each sibling's prompt
        blocks found there count as KV shared instead of copied, as a fork's do."""
        seq.resumed = False
        prompt = min(cached, seq.num_prompt_tokens)
        if seq.index == 0:
            seq.request.metrics.num_cached_tokens = prompt
        else:
            seq.request.metrics.kv_blocks_saved_by_sharing += prompt // self.bm.block_size

    def _fork(self, parent: Sequence, plan: StepPlan) -> list[Sequence]:
        """Share the prompt's blocks with n-1 new sequences (copy a partial block). Children with no
        slot or block wait and are recomputed from the prefix cache later, so this step samples
        only those that run: sampling memory follows the batch, not n."""
        parent.fork_pending = False
        req = parent.request
        computed = parent.num_tokens  # after this step's forward
        running = []
        for i in range(1, req.params.n):
            child = Sequence(req, i, list(parent.token_ids), parent.num_prompt_tokens, stream=req.stream(i))
            req.seqs.append(child)
            if len(self.running) >= self.max_num_seqs:
                self.waiting.append(child)  # no slot now
                continue
            try:
                copy = self.bm.fork(parent, child, computed)
            except NoFreeBlocks:
                self.waiting.append(child)  # no block for its copy
                continue
            if copy:
                plan.copies.append(copy)
            self._run(child)
            running.append(child)
        req.metrics.kv_blocks_saved_by_sharing = computed // self.bm.block_size * len(running)
        return [parent, *running]

    # -- cascade groups ----------------------------------------------------------------------
    def _group_decodes(self, plan: StepPlan) -> None:
        """Order decodes so each request's rows are contiguous, with the prefix each group shares."""
        if self.cascade.enabled is False or len(plan.decodes) < 2:
            return
        decodes = plan.decodes
        decodes.sort(key=lambda s: s.request.seqs[0].seq_id)
        if self.cascade.scope == "batch":
            return self._group_batch(plan)
        starts, prefix_lens, largest, saved = [0], [], 0, 0
        for i, j in request_runs(decodes):
            req = decodes[i].request
            prefix = 0
            if j - i > 1:  # a lone row shares nothing: skip finding its prefix
                prefix = self.cascade.prefix_for(j - i, self._shared_prefix_blocks(req) * self.bm.block_size)
                saved += (j - i - 1) * prefix
            prefix_lens.append(prefix)
            largest = max(largest, j - i)
            starts.append(j)
        if saved and self.cascade.pays(saved, sum(s.num_computed + 1 for s in decodes)):
            plan.group_starts, plan.group_prefix_lens, plan.max_group_size = starts, prefix_lens, largest

    def _group_batch(self, plan: StepPlan) -> None:
        """vLLM V1's cascade: one group of every decode row over the leading blocks that every sequence
        the step runs holds in common (its prefills too), when the policy's thresholds allow."""
        tables = [s.block_table for s in plan.decodes] + [s.block_table for s, _ in plan.prefills]
        n = common_prefix_blocks(tables, min(s.num_computed for s in plan.decodes) // self.bm.block_size)
        rows = len(plan.decodes)
        prefix = self.cascade.prefix_for(rows, n * self.bm.block_size)
        if prefix and self.cascade.pays((rows - 1) * prefix, sum(s.num_computed + 1 for s in plan.decodes)):
            plan.group_starts, plan.group_prefix_lens, plan.max_group_size = [0, rows], [prefix], rows

    def shared_prefix_tokens(self, req: Request) -> int:
        """Tokens at the start of the request's running sequences that they hold in the same blocks."""
        return self._shared_prefix_blocks(req) * self.bm.block_size

    def _shared_prefix_blocks(self, req: Request) -> int:
        """Leading blocks common to all the request's running sequences (cached until one joins or
        leaves: _run and _release drop the entry)."""
        n = self._shared_blocks.get(req.request_id)
        if n is None:
            members = [s for s in req.seqs if s.status is Status.RUNNING and s.block_table]
            n = 0
            if len(members) > 1:
                n = common_prefix_blocks([s.block_table for s in members],
                                         min(s.num_computed for s in members) // self.bm.block_size)
            self._shared_blocks[req.request_id] = n
        return n


def _matched(draft: list[int], token_ids: list[int], kept: int) -> int:
    """Leading drafts equal to the tokens a verified row appended (its last ``kept`` tokens)."""
    new = token_ids[len(token_ids) - kept:]
    m = 0
    while m < min(len(draft), len(new)) and draft[m] == new[m]:
        m += 1
    return m
