"""The model drafts for itself over a windowed KV (MagicDec, arXiv 2408.11049): the same weights and
the same paged cache, each draft step attending only to the row's first ``sink`` tokens and its last
``window`` (with ``selected``, also the blocks between whose keys bound q.k highest: Quest-style
bounds, pacore_kernels/block_select.py); one full pass then verifies the drafts.

A draft step reads the weights plus sink + window tokens of KV per row instead of every live token,
and its K/V go into the row's own slots (the verify pass overwrites them: no extra memory).

Coupled acceptance (the default): the draft at a position is drawn from the window's distribution q
with the noise key the target's own draw uses there (Sampler.keys, drawn once per step), and kept
while the target's draw agrees, so the output is token for token the trajectory without speculation.
Both draws are Gumbel-max over one noise vector (pacore_kernels/gumbel_sample.py), which agree with chance
sum_y 1 / sum_j max(p_j / p_y, q_j / q_y): on the embedded model at temperature 1.0, 0.91-0.92 for
the first draft at a 512-token window, against 0.92-0.94 for rejection sampling and 0.67 for a
coupling by one uniform through the inverse CDF (bench/spec_self_acceptance.py). Rejection acceptance: the
draft is drawn with its own noise and q kept for verification (engine/spec/verify.py,
rejection_runs); a seeded request's noise and accept draws come from streams of its own, keyed by
position (engine/sample/rng.py), so its tokens do not depend on what else runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.sample.penalties import outputs_before, penalize
from engine.sample.rng import DRAFT

if TYPE_CHECKING:
    from engine.worker.model_runner import ModelRunner
    from engine.sample.sampler import Sampler
    from engine.core.step_plan import StepPlan
    from engine.spec.config import SpeculativeConfig


def self_draft(plan: StepPlan, config: SpeculativeConfig, runner: ModelRunner, sampler: Sampler):
    """Fill ``plan.drafts`` (placeholders of each row's length) by running the draft steps. Returns what
    verification needs: the noise keys of every sample entry (coupled), or per row the draft
    distributions q [n, V] (rejection)."""
    rows = [s for s in plan.decodes if s.seq_id in plan.drafts]
    first: dict[int, int] = {}
    for i, s in enumerate(plan.sample_seqs):
        first.setdefault(s.seq_id, i)
    coupled = config.acceptance == "coupled"
    keys = sampler.keys(plan.sample_seqs, plan.sample_offsets) if coupled else None
    q: dict[int, list[torch.Tensor]] = {s.seq_id: [] for s in rows}
    tokens = {s.seq_id: s.token_ids[-1] for s in rows}
    for j in range(max(len(plan.drafts[s.seq_id]) for s in rows)):
        active = [s for s in rows if len(plan.drafts[s.seq_id]) > j]
        logits = runner.run_draft(active, [tokens[s.seq_id] for s in active], j, config.window, config.sink,
                                  window_fraction=config.window_fraction, selected=config.selected)
        # the penalties at the draft's position: the verify pass applies the same ones there
        logits = penalize(logits, active, outputs_before(active, [j] * len(active), plan.drafts))
        if coupled:
            drawn = sampler(logits, active, [j] * len(active), keys=keys[[first[s.seq_id] + j for s in active]])
        else:  # the draft's own noise: a seeded request's from its stream, keyed by position
            drawn = sampler(logits, active, [j] * len(active), keys=sampler.keys(active, [j] * len(active), DRAFT))
            probs = sampler.normalised_probs(logits, [s.params for s in active])
            for s, p in zip(active, probs):
                q[s.seq_id].append(p)  # views of one tensor per step: no copy
        for s, t in zip(active, drawn):
            plan.drafts[s.seq_id][j] = tokens[s.seq_id] = t
    return keys if coupled else {k: torch.stack(v) for k, v in q.items()}
