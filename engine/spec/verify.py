"""Exact verification: which of a row's draft tokens it keeps.

Each position of a verify row is sampled exactly as plain decoding would sample it: the same
distribution (temperature, top-k/top-p/min-p) and, for a seeded request, the same counter-based draw
(seed, trajectory, position). Drafts are kept while the target's own token equals them; the first
position where it differs emits the target's token and ends the run, and when all d drafts agree the
next position's token is emitted too. Every emitted token is therefore the token plain decoding would
draw at that position given the same prefix: the output is the trajectory without speculation (token
for token for greedy and seeded requests, in distribution for unseeded ones), and a draft is accepted
with exactly its probability under the target.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.scheduler import StepPlan
    from engine.sequence import Sequence

# (sequence, the tokens it emits this step, its first entry in plan.sample_seqs)
Run = tuple["Sequence", list[int], int]


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
