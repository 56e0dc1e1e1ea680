"""The one check before a run, whatever runs it (one engine, local replicas, Ray): it refuses settings
that cannot work, takes the results lock, prepares the output and reads what is left to do, once."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..budget import check_max_tokens
from ..config import RunConfig
from ..evaluate.runs import validate_runs
from .files import check_side_files
from .lock import results_lock
from .problems import BadLine, Problem, read_problems
from .resume import PriorWork, confidence_note, prepare_output, read_prior_work, select_pending
from .settings import check_settings_on_resume, settings_path

INTERRUPTED = ("pacore: interrupted; finished problems are saved in {out}. "
               "Run again with --resume to complete the rest.")


class SettingsRefused(ValueError):
    """Settings that cannot work (--runs/--pool, a --max-tokens beyond the context), refused before any work."""


@dataclass(slots=True)
class Pending:
    """What a session runs: the input lines not yet in the output, and what earlier sessions did of
    those begun (problem key -> PriorWork)."""

    todo: list[Problem | BadLine] = field(default_factory=list)
    prior: dict[str, PriorWork] = field(default_factory=dict)


def check_settings(cfg: RunConfig, max_model_len: int | None) -> None:
    """Refuse --runs/--pool and a --max-tokens that cannot work (the latter when the context is known)."""
    validate_runs(cfg)
    if max_model_len is not None:
        check_max_tokens(cfg.max_tokens, max_model_len)


@contextmanager
def preflight(cfg: RunConfig, max_model_len: int | None) -> Iterator[Pending]:
    """Check ``cfg``, then hold the results lock while the run goes on and yield what it has to do.

    ``max_model_len``: the engine's context, when known before the run (None: the budget was checked
    where it is known). Raises SettingsRefused (a ValueError) for bad settings, ResultsLocked when another run holds the
    results file, OutputUnusable for a link (or not a file) where a side file goes (files.py),
    OutputExistsError for a non-empty output without --resume, SettingsChanged for a resume with other
    settings than the results (settings.py); all before any work. A resume that mixes --record-confidence
    with sessions that ran otherwise is said (resume.confidence_note)."""
    try:
        check_settings(cfg, max_model_len)
    except ValueError as e:
        raise SettingsRefused(str(e)) from None
    with results_lock(cfg.out_path):
        check_side_files(cfg.out_path, (settings_path(cfg.out_path),))
        prior = prepare_output(cfg.out_path, cfg.resume)
        check_settings_on_resume(cfg, prior.fresh)
        todo, note = select_pending(read_problems(cfg.data_path), prior, cfg.skip_failed, cfg.runs)
        if note:
            print(f"pacore: {note} ({cfg.out_path})", file=sys.stderr)
        work = read_prior_work(cfg, todo, prior)
        mixed = confidence_note(cfg, prior, work)
        if mixed:
            print(f"pacore: {mixed}", file=sys.stderr)
        yield Pending(todo, work)
