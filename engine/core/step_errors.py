"""A step that fails keeps every other request running: what ``LLM.step`` does when it does.

Two faults end requests in the middle of a step. A step that raises (a kernel error, a dead
tensor-parallel rank) aborts the requests it was running: their KV writes may be half done, so they
cannot continue, and the blocks they filled leave the prefix cache. A request whose logits are NaN or
inf (engine/core/non_finite.py) is set aside before sampling: its rows become zeros, the step runs as
planned for the others, and it is aborted once the step is done. Either way a ``StepError`` hands
back what each request had computed (tokens and logprobs, all from finite logits), so that nothing
is lost: ``add_request(..., resume=..., resume_logprobs=...)`` continues it. The functions take the LLM
whose requests they hand back (this module does not import engine/llm.py, which imports it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.sample.logprobs import TokenLogprobs
from engine.core.non_finite import NonFiniteLogits, non_finite_requests
from engine.core.sequence import Partial

if TYPE_CHECKING:
    from engine.core.step_plan import StepPlan
    from engine.core.sequence import Request


class StepError(RuntimeError):
    """A step failed. The requests it was running were aborted (blocks freed); ``partial`` holds
    each one's ``partial_outputs`` and ``logprobs`` its ``partial_logprobs``, so that nothing computed
    is lost (resume them with ``add_request(..., resume=..., resume_logprobs=...)``). Other requests are untouched and the engine stays usable."""

    def __init__(self, partial: dict[str, list[Partial]], cause: Exception,
                 logprobs: dict[str, list[TokenLogprobs | None]] | None = None):
        self.partial = partial
        self.logprobs = logprobs or {}  # per request, each child's partial_logprobs (resume_logprobs=)
        self.cause = cause
        super().__init__(f"engine step failed ({type(cause).__name__}: {cause}); aborted requests "
                         f"{sorted(partial)}")


def fail_step(llm, plan: StepPlan, error: Exception) -> StepError:
    """The StepError of a step that raised ``error``: its requests (every request, if a rank died)
    handed back and aborted, their blocks out of the prefix cache."""
    ids = {seq.request.request_id for seq, _ in plan.prefills} | {s.request.request_id for s in plan.decodes}
    if llm.runner.dead:
        ids = set(llm.requests)  # no request can run another step: hand every one back
    failed = _hand_back(llm, [rid for rid in sorted(ids) if rid in llm.requests], error)
    abort_set_aside(llm, failed, [])
    return failed


def set_aside_non_finite(llm, plan: StepPlan, logits, scored) -> tuple:
    """Before sampling: the requests whose logits are NaN or inf get a StepError holding their tokens
    and logprobs so far, and their rows become zeros, so that the step runs as planned for every row;
    they are aborted once it is done (abort_set_aside). Returns the logits and the StepError (None:
    every row is finite)."""
    ids = non_finite_requests(plan, logits, scored)
    if not ids:
        return logits, None
    failed = _hand_back(llm, ids, NonFiniteLogits(ids))
    if logits is not None:
        logits = logits.clone()
        logits[[i for i, seq in enumerate(plan.sample_seqs) if seq.request.request_id in failed.partial]] = 0.0
    return logits, failed


def abort_set_aside(llm, failed: StepError, finished: list[Request]) -> list[Request]:
    """Abort the requests ``failed`` holds (their blocks leave the prefix cache), one that finished in
    the step too; returns the other requests that finished."""
    for rid in failed.partial:
        req = llm.requests.pop(rid, None)
        if req is not None:
            llm.scheduler.abort(req, keep_cached=False)
    return [req for req in finished if req.request_id not in failed.partial]


def _hand_back(llm, ids: list[str], cause: Exception) -> StepError:
    return StepError({rid: llm.partial_outputs(rid) for rid in ids}, cause,
                     {rid: llm.partial_logprobs(rid) for rid in ids})
