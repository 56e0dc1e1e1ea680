"""What a session of ``pacore run`` starts from and wraps around its engines, whatever runs them."""
from __future__ import annotations

import sys
from contextlib import nullcontext

from .config import RunConfig
from .io import prepare_output, select_pending
from .problems import BadLine, Problem, read_problems
from .runs import PriorWork, read_prior_work

INTERRUPTED = ("pacore: interrupted; finished problems are saved in {out}. "
               "Run again with --resume to complete the rest.")


def pending_work(cfg: RunConfig) -> tuple[list[Problem | BadLine], dict[str, PriorWork]]:
    """The input lines not yet in the output, and what earlier sessions did of those begun (runs.py)."""
    prior = prepare_output(cfg.out_path, cfg.resume)
    todo, note = select_pending(read_problems(cfg.data_path), prior, cfg.skip_failed, cfg.runs)
    if note:
        print(f"pacore: {note} ({cfg.out_path})", file=sys.stderr)
    return todo, read_prior_work(cfg, todo, prior)


def profiled(llm, profile_dir: str | None):
    """A step-timeline and trace recorder around a run when profile_dir is set (engine/profiler.py)."""
    if not profile_dir:
        return nullcontext()
    from engine.profiler import ProfileSession

    return ProfileSession(llm, profile_dir)
