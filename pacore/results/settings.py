"""The settings that change what a run computes, recorded beside the results file (``REAL.settings.json``),
so that ``--resume`` never mixes results of two settings silently.

A new output records them; a resume compares every one with the recorded ones (preflight.py) and refuses
a difference, naming each setting, unless ``--override-settings`` is given: then the change is recorded
too. ``--runs`` may grow (each run has its own record). The problems of ``--data`` are compared the same
way (problem_set.py: ids and a hash of each problem's content; problems may be added, not changed or
dropped). A settings file that cannot be read (garbage,
too deep, not the shape of one, settings missing) refuses a resume: a weakened check would pass anything;
``--override-settings`` replaces it. So does results without a settings file (removed, or the results
copied without it): an empty output (a kill before the settings were written, which is before the first
record can be) is a new one. One recorded before a setting was added gets it filled in.

Not settings, so a resume may change them: ``--speculative-config`` (speculation is exact: the tokens
decoding without it draws, engine/spec/verify.py, or with acceptance "rejection" the same distribution),
``--batch-invariant``, ``--tensor-parallel``, ``--max-num-seqs``, ``--num-kv-blocks`` and the replicas
(where and how fast it runs, not what it samples from), ``--record-confidence`` (said when it is mixed,
resume.confidence_note), ``--runs``, ``--max-problems-in-flight``, ``--checkpoint-every``, progress and
profiling.
"""
from __future__ import annotations

import json
import os
import time

from ..config import RunConfig
from . import problem_set
from .files import loads_json, side_path

# The setting -> the flag that sets it, in the order differences are named.
FLAGS = {
    "model": "--model",
    "dtype": "--dtype",
    "kv_cache_dtype": "--kv-cache-dtype",
    "max_model_len": "--max-model-len",
    "rope_scaling": "--rope-scaling",
    "rounds": "--preset/--rounds",
    "pool": "--pool",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "seed": "--seed",
    "max_tokens": "--max-tokens",
    "message_token_cap": "--message-token-cap",
    "shuffle": "--shuffle",
    "grade": "--no-grade",
}
# What every settings file has held since the first version that wrote one; the others may be missing
# (a file from before they were recorded) and are filled in.
FIRST = ("model", "dtype", "temperature", "top_p", "max_tokens", "message_token_cap", "max_model_len",
         "rope_scaling")


class SettingsChanged(ValueError):
    """--resume with settings other than those the results file was computed with."""


class SettingsUnreadable(ValueError):
    """--resume over a settings file that cannot be read, which would weaken the check."""


def settings_path(out_path: str) -> str:
    """The settings file beside the real path of ``out_path``."""
    return side_path(out_path, ".settings.json")


def run_settings(cfg: RunConfig) -> dict:
    """The settings of ``cfg`` that change its records, as JSON values."""
    engine = cfg.engine
    model = engine.model
    if isinstance(model, str) and os.path.isdir(model):
        model = os.path.realpath(model)  # one folder, however it is spelled
    settings = {
        "model": model,
        "dtype": None if engine.dtype is None else str(engine.dtype).removeprefix("torch."),
        "kv_cache_dtype": engine.kv_cache_dtype,
        "max_model_len": engine.max_model_len,
        "rope_scaling": engine.rope_scaling,
        "rounds": list(cfg.rounds),
        "pool": cfg.pool,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "seed": cfg.seed,
        "max_tokens": cfg.max_tokens,
        "message_token_cap": cfg.message_token_cap,
        "shuffle": cfg.shuffle,
        "grade": cfg.grade,
    }
    return json.loads(json.dumps(settings))  # compared with what JSON reads back


def read_settings(path: str) -> dict | None:
    """The recorded settings document ({"settings", "changes"}), or None when there is no file (which a
    resume over results refuses: missing_settings). SettingsUnreadable naming the file and why for one
    that cannot be used. The file was checked to be a regular file of its own (files.check_side_files)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SettingsUnreadable(_unreadable(path, e.strerror or str(e))) from None
    try:
        doc = loads_json(data)
    except ValueError as e:
        raise SettingsUnreadable(_unreadable(path, f"not JSON: {e}")) from None
    settings = doc.get("settings") if isinstance(doc, dict) else None
    changes = doc.get("changes", []) if isinstance(doc, dict) else None
    if not isinstance(settings, dict) or not isinstance(changes, list):
        raise SettingsUnreadable(_unreadable(path, "not a settings file"))
    missing = [name for name in FIRST if name not in settings]
    if missing:
        raise SettingsUnreadable(_unreadable(path, f"settings missing: {', '.join(missing)}"))
    if "problems" in doc and not problem_set.valid(doc["problems"]):
        raise SettingsUnreadable(_unreadable(path, "its problems are not the shape of a problem set"))
    return {"settings": settings, "changes": changes, **({"problems": doc["problems"]} if "problems" in doc else {})}


def missing_settings(out_path: str, path: str) -> str:
    """Why a resume over results without their settings file is refused, and the ways on."""
    return (f"{out_path} holds results but no settings file ({path}) to check this resume against the settings "
            f"they were computed with; restore it, choose another --out, or pass --override-settings to record "
            f"this run's settings and go on")


def _unreadable(path: str, why: str) -> str:
    return (f"{path} cannot be read ({why}), so this resume cannot be checked against the settings the results "
            f"were computed with; restore it, choose another --out, or pass --override-settings to record this "
            f"run's settings in its place")


def differences(recorded: dict, now: dict) -> list[str]:
    """The settings whose recorded value differs from ``now`` (one recorded before it existed does not)."""
    return [name for name in FLAGS if name in recorded and recorded[name] != now[name]]


def listed(names: list[str], recorded: dict, now: dict) -> str:
    """Each differing setting named by its flag, with both values."""
    return "; ".join(f"{FLAGS[n]}: {_show(n, recorded[n])} in the results, {_show(n, now[n])} now" for n in names)


def with_change(doc: dict, names: list[str], now: dict) -> dict:
    """The settings document after an --override-settings resume: this run's settings, the change logged."""
    return log_change({**doc, "settings": now},
                      {"from": {n: doc["settings"][n] for n in names}, "to": {n: now[n] for n in names}})


def log_change(doc: dict, change: dict) -> dict:
    """The settings document with ``change`` appended to its log, timed."""
    return {**doc, "changes": [*doc["changes"], {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **change}]}


def read_problem_set(out_path: str) -> dict[str, str] | None:
    """The problem set the results file answers (problem_set.py), or None when none was recorded (results
    from before sets were recorded) or the settings file cannot be read (a resume refuses that first)."""
    try:
        doc = read_settings(settings_path(out_path))
    except SettingsUnreadable:
        return None
    return None if doc is None else doc.get("problems")


def _show(name: str, value: object) -> str:
    if name == "grade":
        return "graded" if value else "not graded"
    return "the default" if value is None else json.dumps(value)
