"""The settings that change what a run computes, recorded beside the results file (``REAL.settings.json``),
so that ``--resume`` never mixes results of two settings silently.

A new output records them; ``--resume`` compares them with the recorded ones and refuses a difference,
naming each setting, unless ``--override-settings`` is given: then the change is recorded too. The round
schedule, seed, shuffle and pool are checked per checkpoint instead (resume.py: a round run with other
ones is run again), and ``--runs`` may grow. An output written before settings were recorded has none
to compare: its first resume records them.

--speculative-config is not a setting: speculation is exact (the tokens decoding without it draws,
engine/spec/verify.py; with --batch-invariant bit for bit, otherwise up to the float noise of batching),
so a resume may turn it on or off.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..config import RunConfig
from .files import loads_json, side_path, write_json

# The setting -> the flag that sets it.
FLAGS = {
    "model": "--model",
    "dtype": "--dtype",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "max_tokens": "--max-tokens",
    "message_token_cap": "--message-token-cap",
    "max_model_len": "--max-model-len",
    "rope_scaling": "--rope-scaling",
}


class SettingsChanged(ValueError):
    """--resume with settings other than those the results file was computed with."""


def settings_path(out_path: str) -> str:
    """The settings file beside the real path of ``out_path``."""
    return side_path(out_path, ".settings.json")


def run_settings(cfg: RunConfig) -> dict:
    """The settings of ``cfg`` that change its results, as JSON values."""
    engine = cfg.engine_options
    model = engine.get("model")
    if isinstance(model, str) and os.path.isdir(model):
        model = os.path.realpath(model)  # one folder, however it is spelled
    dtype = engine.get("dtype")
    settings = {
        "model": model,
        "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_tokens": cfg.max_tokens,
        "message_token_cap": cfg.message_token_cap,
        "max_model_len": engine.get("max_model_len"),
        "rope_scaling": engine.get("rope_scaling"),
    }
    return json.loads(json.dumps(settings))  # compared with what JSON reads back


def check_settings_on_resume(cfg: RunConfig, fresh: bool) -> None:
    """Record ``cfg``'s settings beside its results; on a resume (``fresh`` False: the output holds
    work), first refuse settings that differ from the recorded ones, unless ``cfg.override_settings``
    (then the change is recorded). Raises SettingsChanged naming each differing setting."""
    path = settings_path(cfg.out_path)
    now = run_settings(cfg)
    doc = None if fresh else _read(path)
    if doc is None:
        write_json(path, {"settings": now, "changes": []})
        return
    before = doc["settings"]
    differ = [name for name in FLAGS if name in before and before[name] != now[name]]
    if not differ:
        return
    listed = "; ".join(f"{FLAGS[n]}: {_show(before[n])} in the results, {_show(now[n])} now" for n in differ)
    if not cfg.override_settings:
        raise SettingsChanged(
            f"{cfg.out_path} was computed with other settings ({listed}); resuming would mix results of both. "
            f"Pass the same flags, choose another --out, or pass --override-settings to continue with these "
            f"(the change is recorded in {path})")
    print(f"pacore: continuing with other settings than the results so far ({listed}), as "
          f"--override-settings asks; recorded in {path}", file=sys.stderr)
    doc["changes"].append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "from": {n: before[n] for n in differ}, "to": {n: now[n] for n in differ}})
    write_json(path, {"settings": {**before, **now}, "changes": doc["changes"]})


def _read(path: str) -> dict | None:
    """The recorded settings, or None: none recorded (an earlier version), or a file that cannot be used."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            doc = loads_json(f.read())
    except (OSError, ValueError) as e:
        doc = e
    if isinstance(doc, dict) and isinstance(doc.get("settings"), dict) and isinstance(doc.get("changes", []), list):
        return {"settings": doc["settings"], "changes": list(doc.get("changes", []))}
    print(f"pacore: {path} cannot be used ({doc if isinstance(doc, Exception) else 'not a settings file'}); "
          f"recording this run's settings in its place", file=sys.stderr)
    return None


def _show(value: object) -> str:
    return "the default" if value is None else json.dumps(value)
