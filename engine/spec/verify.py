"""Exact verification: which of a row's draft tokens it keeps.

Each position of a verify row is sampled exactly as plain decoding would sample it: the same
distribution (temperature, top-k/top-p/min-p) and, for a seeded request, the same counter-based draw
(seed, trajectory, position). Drafts are kept while the target's own token equals them; the first
position where it differs emits the target's token and ends the run, and when all d drafts agree the
next position's token is emitted too. Every emitted token is therefore the token plain decoding would
draw at that position given the same prefix: the output is the trajectory without speculation (token
for token for greedy and seeded requests, in distribution for unseeded ones), and a draft is accepted
with exactly its probability under the target.

``rejection_runs`` is textbook speculative sampling for drafts drawn from a full distribution q (a
self-drafting step's): a draft d is kept with probability min(1, p(d) / q(d)), a rejected one replaced
by a draw from norm(max(0, p - q)), and a bonus drawn from p when all are kept. The output has the
target's distribution exactly, with different tokens than plain decoding would draw.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.scheduler import Run

if TYPE_CHECKING:
    from engine.sampler import Sampler
    from engine.scheduler import StepPlan


def accepted_runs(plan: StepPlan, tokens: list[int]) -> list[Run]:
    """One run per sampled sequence, from the tokens sampled at each of the plan's sample entries."""
    drafts = plan.drafts
    if not drafts:
        return [(seq, [t], i) for i, (seq, t) in enumerate(zip(plan.sample_seqs, tokens))]
    runs: list[Run] = []
    seqs, i = plan.sample_seqs, 0
    while i < len(tokens):
        seq = seqs[i]
        draft = drafts.get(seq.seq_id, ())
        run = [tokens[i]]
        for j, d in enumerate(draft):
            if run[-1] != d:
                break
            run.append(tokens[i + j + 1])
        runs.append((seq, run, i))
        i += len(draft) + 1
    return runs


def rejection_runs(plan: StepPlan, logits: torch.Tensor, q: dict[int, torch.Tensor], sampler: Sampler) -> list[Run]:
    """Runs for drafts drawn from q (seq id -> [n, V], the distribution each draft was drawn from); a greedy
    row keeps its drafts while the target's argmax agrees, as accepted_runs does."""
    runs: list[Run] = []
    seqs, i = plan.sample_seqs, 0
    gen = sampler.generator
    while i < len(seqs):
        seq = seqs[i]
        draft = plan.drafts.get(seq.seq_id, ()) if plan.drafts else ()
        n = len(draft)
        rows = logits[i:i + n + 1]
        if seq.params.greedy or not n:
            tokens = rows.argmax(dim=-1).tolist() if seq.params.greedy else sampler(rows, [seq], [0])
            run = [tokens[0]]
            for j, d in enumerate(draft):
                if run[-1] != d:
                    break
                run.append(tokens[j + 1])
        else:
            p = sampler.normalised_probs(rows, [seq.params] * (n + 1))
            qs = q[seq.seq_id].to(p.device)
            r = torch.rand(n + 1, dtype=torch.float64, generator=gen, device=sampler.device).tolist()
            run = []
            for j, d in enumerate(draft):
                if r[j] * qs[j, d].item() < p[j, d].item():  # kept with probability min(1, p/q)
                    run.append(d)
                    continue
                residual = (p[j] - qs[j]).clamp_min_(0)
                if residual.sum() <= 0:  # p == q: nothing to correct (never reached: then p/q = 1)
                    residual = p[j]
                run.append(_draw(residual, gen, sampler.device))
                break
            else:
                run.append(_draw(p[n], gen, sampler.device))
        runs.append((seq, run, i))
        i += n + 1
    return runs


def _draw(weights: torch.Tensor, gen: torch.Generator, device) -> int:
    cdf = weights.double().cumsum(0)
    u = torch.rand(1, dtype=torch.float64, generator=gen, device=device).to(cdf.device)
    return int(torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_(max=cdf.shape[0] - 1))
