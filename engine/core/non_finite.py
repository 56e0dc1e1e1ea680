"""Logits that are not finite (NaN or inf: a numerical fault of the model, its dtype or a kernel).

Nothing can be sampled from such a row: a draw would be arbitrary and its logprobs NaN. The engine
takes the requests whose rows hold one out of the step (``LLM.step``): they are aborted, their
tokens so far handed back in a StepError whose cause is NonFiniteLogits, and every other request in
the step goes on. Finding them costs one reduction per step when there are none.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.sample.logprobs import LogprobRows
    from engine.core.step_plan import StepPlan


class NonFiniteLogits(RuntimeError):
    """The model computed NaN or inf logits for these requests."""

    def __init__(self, request_ids: list[str]):
        self.request_ids = request_ids
        super().__init__(f"the model computed non-finite logits (NaN or inf) for request(s) {request_ids}, so "
                         "nothing could be sampled; they were aborted (a numerical fault: a higher-precision "
                         "--dtype may avoid it)")


def non_finite_requests(plan: StepPlan, logits: torch.Tensor | None, scored: LogprobRows | None) -> list[str]:
    """The ids of the requests whose sampled rows (``logits``, one per ``plan.sample_seqs``) or
    scored prompt rows are not finite, in step order."""
    bad: dict[str, None] = {}
    if logits is not None and plan.sample_seqs and not bool(torch.isfinite(logits).all()):
        rows = (~torch.isfinite(logits)).any(dim=-1).nonzero().flatten().tolist()
        bad.update((plan.sample_seqs[i].request.request_id, None) for i in rows)
    if scored is not None:  # host floats already: a NaN logit leaves a NaN log-probability
        at = 0
        for span in plan.scored:
            if not all(math.isfinite(x) or x == -math.inf for x in scored.logprobs[at:at + span.count]):
                bad[span.seq.request.request_id] = None
            at += span.count
    return list(bad)
