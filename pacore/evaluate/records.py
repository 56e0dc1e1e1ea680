"""The results record of one run of a problem: the reference pipeline's keys first, then ours.

The reference pipeline (stepfun-ai/PaCoRe, pacore/batch_inference/base_exp.py, ``process_single``)
writes ``request_id``, ``final_response``, ``final_reasoning_content`` and ``round_responses`` (per
round, a list of ``{content, reasoning_content}`` in the order that round's responses were passed
on). Served as its README says (plain ``vllm serve``, no reasoning parser), ``content`` is the whole
generated text and ``reasoning_content`` is "" (its streaming client joins an absent field to "").
"""
from __future__ import annotations

from ..compaction import Trajectory
from ..results.problems import BadLine
from .grading import answers_equal, grade, majority_vote
from .stats import RoundStats


def run_record(pid, run: int, rounds: list[list[Trajectory]], stats: list[RoundStats], *, gold: str | None,
               graded: bool, k1: int, pool: dict | None) -> dict:
    """The record of a finished run; ``pool`` describes the draw when round 1 came from a pool."""
    final = rounds[-1][0] if rounds[-1] else Trajectory(0, "")
    answer, correct = grade(final.message.strip(), gold) if graded else (None, None)
    sc_answer = majority_vote(stats[0].answers) if graded else None
    sc_correct = None
    if graded and gold is not None:
        sc_correct = sc_answer is not None and answers_equal(gold, sc_answer)
    record = {
        "request_id": pid,
        "final_response": final.text,
        "final_reasoning_content": "",
        "round_responses": [[t.to_record() for t in rnd] for rnd in rounds],
        "run": run,
        "rounds_stats": [s.to_dict() for s in stats],
        # The paper's effective test-time compute: every token of every trajectory this run used.
        "effective_compute_tokens": sum(s.generated_tokens for s in stats),
        "answer": answer,
        "correct": correct,
        "self_consistency": {"k": k1, "answer": sc_answer, "correct": sc_correct},
    }
    if pool is not None:
        record["pool"] = pool
    return record


def error_record(pid, run: int | None, error: str, line_no: int, **partial) -> dict:
    """The record of a run (or an input line, ``run`` None) that could not finish."""
    record = {"request_id": pid, "error": error, "line": line_no}
    if run is not None:
        record["run"] = run
    record.update(partial)
    return record


def bad_line_record(line: BadLine) -> dict:
    """The record of an input line that is no problem: keyed by its line (``keys.record_key``), so it
    never counts as, or shadows, a problem of that id."""
    return with_extra(error_record(line.id, None, line.error, line.line_no, input_error=True), line.extra)


def with_extra(record: dict, extra: dict) -> dict:
    """``record`` with the input's other keys (those it does not set itself) carried over."""
    for key, value in extra.items():
        record.setdefault(key, value)
    return record
