"""The scheduler's one seam for speculative decoding: draft tokens for a step's decode rows (with room
for them in the cache), and the counters of what verification accepted. N-gram drafts are chosen here,
while the step is planned; self-drafted ones (engine/spec/self_window.py) are placeholders the model
fills before the verify forward.

A row with d drafts runs d + 1 queries in one step (its last token, then the drafts) and writes their
K/V into its own slots; verification (engine/spec/verify.py) keeps the drafts the target's own draws
agree with, and the scheduler releases the blocks only rejected drafts used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.spec.config import SpeculativeConfig
from engine.spec.ngram import NgramDrafter
from engine.spec.policy import DepthPolicy
from engine.spec.self_window import self_draft

if TYPE_CHECKING:
    from engine.core.block_manager import BlockManager
    from engine.core.step_plan import StepPlan
    from engine.core.sequence import Sequence

CORPORA = ("prompt", "own", "sibling", "model")


@dataclass(slots=True)
class SpecStats:
    """Counters since the engine started (vLLM's names where it has them: a "draft" is one row's
    drafts in one verify step)."""

    num_drafts: int = 0            # rows verified with at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0   # drafts the target's draws agreed with, up to a stop
    num_emitted_tokens: int = 0    # tokens the verified rows appended (accepted + the target's own)
    accepted_per_pos: list[int] = field(default_factory=list)  # [j]: drafts accepted at draft position j
    # corpus -> [drafts, draft tokens, accepted tokens]
    by_corpus: dict[str, list[int]] = field(default_factory=lambda: {c: [0, 0, 0] for c in CORPORA})

    def as_dict(self, policy: DepthPolicy | None = None) -> dict:
        """LLM.stats()'s keys; with a depth policy, the steps it gave each depth and its acceptance."""
        chosen = {} if policy is None else dict(spec_decode_depth_steps=dict(sorted(policy.chosen.items())),
                                                spec_decode_acceptance_estimate=policy.acceptance)
        return chosen | dict(spec_decode_num_drafts=self.num_drafts, spec_decode_num_draft_tokens=self.num_draft_tokens,
                    spec_decode_num_accepted_tokens=self.num_accepted_tokens,
                    spec_decode_acceptance_rate=self.num_accepted_tokens / max(1, self.num_draft_tokens),
                    spec_decode_num_emitted_tokens=self.num_emitted_tokens,
                    spec_decode_mean_tokens_per_verify=self.num_emitted_tokens / max(1, self.num_drafts),
                    spec_decode_num_accepted_tokens_per_pos=list(self.accepted_per_pos))


class Speculator:
    def __init__(self, config: SpeculativeConfig, block_manager: BlockManager, max_model_len: int,
                 policy: DepthPolicy | None = None):
        self.config = config
        self.policy = policy  # each step's depth (self-drafting, policy "adaptive"); None: num_speculative_tokens
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.drafter = NgramDrafter(config.prompt_lookup_min, config.prompt_lookup_max, config.lookup_siblings)
        self.self_drafting = config.method == "self_window"
        self.draft_sampler = None  # self-drafting's draws; None: the engine's sampler (a rehearsal scripts them)
        self.stats = SpecStats(accepted_per_pos=[0] * config.num_speculative_tokens)
        self._corpus: dict[int, str] = {}  # seq id -> where this step's draft came from

    def draft(self, plan: StepPlan, budget: int) -> int:
        """Fill ``plan.drafts`` for its decode rows and allocate their slots; returns the token budget
        left. A row drafts no further than its max_tokens and the context allow (a run never passes
        where decoding would stop anyway), and only into blocks it holds or free ones: drafts never
        preempt anything."""
        k, bm, bs = self.config.num_speculative_tokens, self.bm, self.bm.block_size
        self._corpus.clear()
        if self.policy is not None:
            k = self.policy.choose([s.num_computed + 1 for s in plan.decodes])
        for seq in plan.decodes if k else ():
            room = min(k, budget, seq.params.max_tokens - seq.num_generated - 1,
                       self.max_model_len - seq.num_tokens - 1,
                       (len(seq.block_table) + bm.num_free) * bs - seq.num_computed - 1)
            if room <= 0:
                continue
            if self.self_drafting:
                draft, corpus = [0] * room, "model"  # filled by the draft steps, before the verify forward
            else:
                draft, corpus = self.drafter.propose(seq, room)
            if not draft:
                continue
            need = seq.num_computed + 1 + len(draft)
            if need > len(seq.block_table) * bs:  # most steps the row's last block has room for its drafts
                bm.allocate(seq, need)
            plan.drafts[seq.seq_id] = draft
            self._corpus[seq.seq_id] = corpus
            budget -= len(draft)
        return budget

    def draft_with_model(self, plan: StepPlan, runner, sampler):
        """Self-drafting: run the step's draft steps, filling plan.drafts' placeholders; returns what
        verification needs of them (engine/spec/self_window.py). None for n-gram drafts."""
        if not (self.self_drafting and plan.drafts):
            return None
        return self_draft(plan, self.config, runner, self.draft_sampler or sampler)

    def count(self, seq: Sequence, draft: list[int], matched: int, kept: int) -> None:
        """One verified row: ``matched`` leading drafts agreed with the target's draws, ``kept`` tokens
        were appended (fewer when a stop cut the run)."""
        st = self.stats
        accepted = min(matched, kept)
        st.num_drafts += 1
        st.num_draft_tokens += len(draft)
        st.num_accepted_tokens += accepted
        if self.policy is not None:
            self.policy.observe(len(draft), matched)
        st.num_emitted_tokens += kept
        for j in range(accepted):
            st.accepted_per_pos[j] += 1
        m = seq.request.metrics  # per request too: pacore run's per-round table
        m.spec_decode_num_drafts += 1
        m.spec_decode_num_draft_tokens += len(draft)
        m.spec_decode_num_accepted_tokens += accepted
        m.spec_decode_num_emitted_tokens += kept
        c = st.by_corpus[self._corpus.get(seq.seq_id, "own")]
        c[0] += 1
        c[1] += len(draft)
        c[2] += accepted
