"""The model drafts for itself over a windowed KV (MagicDec, arXiv 2408.11049): the same weights and
the same paged cache, each draft step attending only to the row's first ``sink`` tokens and its last
``window``; one full pass then verifies the drafts.

A draft step reads the weights plus sink + window tokens of KV per row instead of every live token,
and its K/V go into the row's own slots (the verify pass overwrites them: no extra memory).

Coupled acceptance (the default): the draft at a position is drawn from the window's distribution q
with the same uniform the target's own draw uses there (Sampler.uniforms, drawn once per step), and
kept while the target's draw agrees, so the output is token for token the trajectory without
speculation. Rejection acceptance: the draft is drawn with its own noise and q kept for verification
(engine/spec/verify.py, rejection_runs).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.model_runner import ModelRunner
    from engine.sampler import Sampler
    from engine.scheduler import StepPlan
    from engine.spec.config import SpeculativeConfig


def self_draft(plan: StepPlan, config: SpeculativeConfig, runner: ModelRunner, sampler: Sampler):
    """Fill ``plan.drafts`` (placeholders of each row's length) by running the draft steps. Returns what
    verification needs: the uniforms of every sample entry (coupled), or per row the draft
    distributions q [n, V] (rejection)."""
    rows = [s for s in plan.decodes if s.seq_id in plan.drafts]
    first: dict[int, int] = {}
    for i, s in enumerate(plan.sample_seqs):
        first.setdefault(s.seq_id, i)
    coupled = config.acceptance == "coupled"
    u = sampler.uniforms(plan.sample_seqs, plan.sample_offsets) if coupled else None
    q: dict[int, list[torch.Tensor]] = {s.seq_id: [] for s in rows}
    tokens = {s.seq_id: s.token_ids[-1] for s in rows}
    for j in range(max(len(plan.drafts[s.seq_id]) for s in rows)):
        active = [s for s in rows if len(plan.drafts[s.seq_id]) > j]
        logits = runner.run_draft(active, [tokens[s.seq_id] for s in active], j, config.window, config.sink)
        if coupled:
            drawn = sampler(logits, active, [j] * len(active), u=u[[first[s.seq_id] + j for s in active]])
        else:
            drawn = sampler(logits, active, [j] * len(active), u=torch.rand(len(active), dtype=torch.float64,
                                                                              generator=sampler.generator,
                                                                              device=sampler.device))
            probs = sampler.normalised_probs(logits, [s.params for s in active])
            for s, p in zip(active, probs):
                q[s.seq_id].append(p)  # views of one tensor per step: no copy
        for s, t in zip(active, drawn):
            plan.drafts[s.seq_id][j] = tokens[s.seq_id] = t
    return u if coupled else {k: torch.stack(v) for k, v in q.items()}
