"""The one check before a run, whatever runs it (one engine, local replicas, Ray), in the order it goes:

1. the flags alone: --data and --out, --runs and --pool;
2. every file the run will touch, opened and checked: the results file (created if need be, a regular
   file, never waited on, locked: one run per results file) and the files beside it (no link, nothing
   but a file of its own where a file goes: files.check_side_files);
3. what is there: the results of earlier sessions (a non-empty output needs --resume) and the settings
   they were computed with;
4. the settings compared: any that changes a record and differs is refused, naming each, unless
   --override-settings (settings.py); so are problems of --data that differ from those the results
   answer (problem_set.py: changed or dropped; added ones are new work);
5. the decision: what is left to run and what it continues from (resume.py), said in a line or two;
   with something to run, --max-tokens against the model's context (read from its config.json: a
   resume with nothing left reads no model at all); then the settings are recorded and the run goes
   on, the lock held until its summary is written.

Every refusal comes before any work and leaves nothing behind: files this run created are removed
again when it stops before anything was computed (a refusal, a model that fails to load).
"""
from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..budget import check_max_tokens
from ..config import RunConfig
from ..evaluate.runs import validate_runs
from . import problem_set
from .files import check_side_files, rounds_path, same_file, snapshot_dir, write_json
from .lock import OutputUnusable, ResultsLocked, results_lock
from .problems import BadLine, Problem, read_problems
from .resume import (OutputExistsError, PriorResults, PriorWork, confidence_note, prepare_output, read_prior_work,
                     select_pending, stale_snapshots)
from .settings import (SettingsChanged, SettingsUnreadable, differences, listed, log_change, missing_settings,
                       read_settings, run_settings, settings_path, with_change)

INTERRUPTED = ("pacore: interrupted; finished problems are saved in {out}. "
               "Run again with --resume to complete the rest.")
# What a stop says when every problem of the session was recorded before it came: nothing to resume.
COMPLETE = "pacore: interrupted after every problem was recorded; the results in {out} are complete"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGTERM, SIGHUP) once the runner or driver has said what is saved (INTERRUPTED or
    COMPLETE), so that the command does not say it again."""


class SettingsRefused(ValueError):
    """Flags that cannot work (paths, --runs/--pool, a --max-tokens beyond the context), refused before any work."""


# Everything the preflight refuses with: each says what is wrong and how to fix it, in one line.
REFUSALS = (SettingsRefused, SettingsChanged, SettingsUnreadable, OutputExistsError, ResultsLocked, OutputUnusable)


@dataclass(slots=True)
class Pending:
    """What a session runs: the input lines not yet in the output, and what earlier sessions did of
    those begun (problem key -> PriorWork)."""

    todo: list[Problem | BadLine] = field(default_factory=list)
    prior: dict[str, PriorWork] = field(default_factory=dict)


@contextmanager
def preflight(cfg: RunConfig, max_model_len: int | Callable[[], int] | None) -> Iterator[Pending]:
    """Check ``cfg`` (steps 1-5 above), then hold the results lock while the run goes on and yield what it
    has to do.

    ``max_model_len``: the engine's context, or a function reading it from the model's config (called
    only when there is something to run); None: the budget is checked where it is known. Raises one of
    REFUSALS, all before any work."""
    # 1. the flags alone
    why = refused_paths(cfg)
    if why:
        raise SettingsRefused(why)
    try:
        validate_runs(cfg)
    except ValueError as e:
        raise SettingsRefused(str(e)) from None
    # 2. every file the run touches (the results file opened and locked; _checked: the others)
    folders = _missing_folders(cfg.out_path)  # made by the lock
    try:
        with results_lock(cfg.out_path):
            try:
                yield from _checked(cfg, max_model_len)
            except BaseException:  # a refusal, or a run that stopped before it computed anything
                _undo_if_nothing_computed(cfg)
                raise
    except BaseException:
        for folder in folders:  # those left empty (the lock's pid file gone with the lock)
            try:
                os.rmdir(folder)
            except OSError:
                break
        raise


def _checked(cfg: RunConfig, max_model_len: int | Callable[[], int] | None) -> Iterator[Pending]:
    """Steps 2-5, the results lock held."""
    path = settings_path(cfg.out_path)
    check_side_files(cfg.out_path, (path,))
    _remove_torn_writes(cfg.out_path)
    # 3. what is there
    prior = prepare_output(cfg.out_path, cfg.resume)
    recorded = None
    if not prior.fresh:
        try:
            recorded = read_settings(path)
            if recorded is None:  # results with nothing to check this resume against
                raise SettingsUnreadable(missing_settings(cfg.out_path, path))
        except SettingsUnreadable:
            if not cfg.override_settings:
                raise
            what = "cannot be read" if os.path.lexists(path) else "is missing"
            print(f"pacore: {path} {what}; recording this run's settings in its place, as --override-settings asks",
                  file=sys.stderr)
    # 4. the settings compared, and the problems
    now = run_settings(cfg)
    doc = {"settings": now, "changes": []} if recorded is None else _compared(cfg, recorded, now, path)
    items = list(read_problems(cfg.data_path))  # once: --data may be a pipe
    doc = _problems_compared(cfg, doc, problem_set.identity(items), path)
    _warn_outside(cfg, prior, doc["problems"])
    # 5. the decision
    todo, note = select_pending(items, prior, cfg.skip_failed, cfg.runs)
    if note:
        print(f"pacore: {note} ({cfg.out_path})", file=sys.stderr)
    if todo:  # the budget against the model's context (read only when there is something to run)
        try:
            context = max_model_len() if callable(max_model_len) else max_model_len
            if context is not None:
                check_max_tokens(cfg.max_tokens, context)
        except (ValueError, OSError, RuntimeError) as e:  # no such model, a size that cannot split it, a budget
            raise SettingsRefused(str(e)) from None
    work = read_prior_work(cfg, todo, prior)
    if not prior.fresh:  # what a kill left of work since recorded or checkpointed goes
        from .snapshots import SnapshotStore  # torch: only once there are results (`pacore run` starts without)

        SnapshotStore(cfg.out_path).prune(*stale_snapshots(prior, work))
    mixed = confidence_note(cfg, prior, work)
    if mixed:
        print(f"pacore: {mixed}", file=sys.stderr)
    held = _snapshots(cfg.out_path) if not prior.fresh and todo else 0
    if held:
        print(f"pacore: resuming: {held} round{'s' if held > 1 else ''} in flight continue from their snapshots "
              f"({snapshot_dir(cfg.out_path)})", file=sys.stderr)
    if doc != recorded:
        write_json(path, doc)
    yield Pending(todo, work)


def refused_paths(cfg: RunConfig) -> str | None:
    """Why the run cannot use its --data and --out (and the flags that need --resume) as given, or None."""
    try:
        mode = os.stat(cfg.data_path).st_mode
    except FileNotFoundError:
        return f"no such input file: {cfg.data_path}"
    except OSError as e:
        return f"cannot read --data {cfg.data_path}: {e.strerror}"
    if stat.S_ISDIR(mode):
        return f"--data {cfg.data_path} is a directory; pass a problems file (JSONL, or a JSON array of problems)"
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # a pipe (<(...), mkfifo) is read once, whole
        kind = "character device" if stat.S_ISCHR(mode) else "block device" if stat.S_ISBLK(mode) else "socket"
        return (f"--data {cfg.data_path} is a {kind}, not a problems file; pass a file, or pipe one in "
                f"(--data <(cat problems.jsonl))")
    if os.path.isdir(cfg.out_path):
        return (f"--out {cfg.out_path} is a directory; pass a file path such as "
                f"{os.path.join(cfg.out_path, 'results.jsonl')}")
    if same_file(cfg.data_path, cfg.out_path):
        return f"--out {cfg.out_path} is the input file; results would be appended to the problems. Choose another --out"
    if cfg.skip_failed and not cfg.resume:
        return "--skip-failed only applies with --resume"
    if cfg.override_settings and not cfg.resume:
        return "--override-settings only applies with --resume"
    return None


def _compared(cfg: RunConfig, recorded: dict, now: dict, path: str) -> dict:
    """The settings document to keep: the recorded one (completed with settings it predates), or with
    --override-settings the change logged; SettingsChanged naming each difference otherwise."""
    differ = differences(recorded["settings"], now)
    if not differ:
        return {**recorded, "settings": {**now, **recorded["settings"]}}
    both = listed(differ, recorded["settings"], now)
    if not cfg.override_settings:
        raise SettingsChanged(
            f"{cfg.out_path} was computed with other settings ({both}); resuming would mix results of both. "
            f"Pass the same flags, choose another --out, or pass --override-settings to continue with these "
            f"(the change is recorded in {path})")
    print(f"pacore: continuing with other settings than the results so far ({both}), as --override-settings "
          f"asks; recorded in {path}", file=sys.stderr)
    return with_change(recorded, differ, now)


def _problems_compared(cfg: RunConfig, doc: dict, now: dict[str, str], path: str) -> dict:
    """The settings document with this --data's problem set (problem_set.py): a recorded set whose problems
    changed or are missing refuses the resume (SettingsChanged naming the ids) unless --override-settings,
    which logs the change; problems added to the file are new work. A set recorded before sets were is
    filled in."""
    recorded = doc.get("problems")
    changed, missing = problem_set.differences(recorded, now) if recorded is not None else ([], [])
    if changed or missing:
        what = problem_set.listed(changed, missing)
        if not cfg.override_settings:
            raise SettingsChanged(
                f"{cfg.out_path} answers other problems than --data {cfg.data_path} ({what}); resuming would "
                f"keep their records and grade them as these. Pass the --data they were computed from, choose "
                f"another --out, or pass --override-settings to go on with this --data (records of problems not "
                f"in it are then left out of the summary; the change is recorded in {path})")
        print(f"pacore: continuing with other problems than the results so far ({what}), as --override-settings "
              f"asks; recorded in {path}", file=sys.stderr)
        doc = log_change(doc, {"problems": {"changed": changed, "missing": missing}})
    return {**doc, "problems": now}


def _warn_outside(cfg: RunConfig, prior: PriorResults, problems: dict[str, str]) -> None:
    """Say which recorded problems are not in --data: the summary leaves them out (problem_set.outside)."""
    keys = {k if isinstance(k, str) else k[0] for k in prior.done | prior.failed}
    stray = sorted(keys - problems.keys())
    if stray:
        print(f"pacore: {cfg.out_path} holds records of {problem_set.listed([], stray)}; they are not counted in "
              f"the summary", file=sys.stderr)


def _snapshots(out_path: str) -> int:
    try:
        return sum(name.endswith(".pt") for name in os.listdir(snapshot_dir(out_path)))
    except OSError:
        return 0


def _remove_torn_writes(out_path: str) -> None:
    """Remove the temporary files of a settings or summary write a kill cut short (files.replace_atomically's
    names; regular files only, never a link): the results lock is held, so no run is writing them."""
    real = os.path.realpath(out_path)
    folder, base = os.path.split(real)
    torn = re.compile(re.escape(base) + r"\.(settings|summary)\.json\.[0-9a-f]{16}\.tmp")
    try:
        names = os.listdir(folder or ".")
    except OSError:  # a folder that cannot be listed: nothing to tidy that we can see
        return
    for name in names:
        if torn.fullmatch(name):
            p = os.path.join(folder, name)
            try:
                if stat.S_ISREG(os.lstat(p).st_mode):
                    os.unlink(p)
            except OSError:
                pass


def _missing_folders(out_path: str) -> list[str]:
    """The folders of the results file's real path that do not exist yet, innermost first."""
    missing, folder = [], os.path.dirname(os.path.realpath(out_path))
    while folder and not os.path.isdir(folder) and folder != os.path.dirname(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def _undo_if_nothing_computed(cfg: RunConfig) -> None:
    """A new output's run stopped before it computed anything (nothing recorded, checkpointed or
    snapshotted: a refusal, a model that fails to load): remove the files it made, empty (the results
    file, the checkpoint file) or not (the settings), so that it leaves nothing behind (the folders it
    made go once empty, after the lock). The results file is locked: no other run writes it meanwhile."""
    made = [os.path.realpath(cfg.out_path), rounds_path(cfg.out_path), settings_path(cfg.out_path)]
    if holds_work(cfg.out_path):
        return
    for p in made:
        try:
            if os.path.isfile(p) and not os.path.islink(p):
                os.unlink(p)
        except OSError:
            pass


def holds_work(out_path: str) -> bool:
    """Whether the output holds anything computed: a record, a round checkpoint or a snapshot."""
    return bool(_size(os.path.realpath(out_path)) or _size(rounds_path(out_path)) or _snapshots(out_path))


def stopped_early(out_path: str) -> str:
    """What a stop before the run loop began (in the preflight, while the model loads) says."""
    if holds_work(out_path):
        return INTERRUPTED.format(out=out_path)
    return "pacore: interrupted before any problem started; nothing was saved"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
