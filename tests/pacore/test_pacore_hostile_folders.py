"""Hostile model folders through the commands (issue 52, item 2): `pacore run --model DIR` and `pacore serve
--model DIR` refuse them with exit status 2 and one line on stderr, no traceback (every case:
tests/engine/test_engine_hostile_folders.py)."""
import json
import shutil
import struct
import subprocess
import sys

import pytest

from pacore.cli import main
from test_pacore_runner import _cfg


def _heads_a_string(d):
    cfg = json.loads((d / "config.json").read_text()) | {"num_attention_heads": "8"}
    (d / "config.json").write_text(json.dumps(cfg))


def _header_past_the_end(d):
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 10**6) + data[8:100])


def _linked_outside(d):
    shutil.move(d / "model.safetensors", d.parent / "elsewhere.safetensors")
    (d / "model.safetensors").symlink_to(d.parent / "elsewhere.safetensors")


def _generation_config_a_list(d):
    (d / "generation_config.json").write_text("[1]")


CASES = {"heads-a-string": (_heads_a_string, "num_attention_heads"),  # refused before the run starts (its context)
         "generation-config-a-list": (_generation_config_a_list, "generation_config.json"),  # serve reads it first
         "header-past-the-end": (_header_past_the_end, "not a whole safetensors file"),  # as the weights load
         "symlink-outside": (_linked_outside, "outside the model folder")}


@pytest.fixture
def hostile(tiny_model_dir, tmp_path, request):
    mutate, named = CASES[request.param]
    d = tmp_path / "model"
    shutil.copytree(tiny_model_dir("qwen3"), d)
    mutate(d)
    return str(d), named


def _one_line(err: str, named: str) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("pacore: ") and named in lines[0], err


def _loaded(*args, **kwargs):  # a model that loads runs no problem and serves nothing here
    raise AssertionError("the hostile model folder was loaded")


@pytest.mark.parametrize("hostile", CASES, indirect=True)
def test_pacore_run_refuses_a_hostile_model_folder_in_one_line_exit_2(hostile, tmp_path, capsys, monkeypatch):
    import pacore.runner

    monkeypatch.setattr(pacore.runner, "run_pacore", _loaded)
    model, named = hostile
    cfg = _cfg(tmp_path, n_problems=1)
    argv = ["run", "--data", cfg.data_path, "--out", cfg.out_path, "--no-progress", "--checkpoint-every", "0",
            "--model", model, "--num-kv-blocks", "8"]
    assert main(argv) == 2
    _one_line(capsys.readouterr().err, named)


@pytest.mark.parametrize("hostile", CASES, indirect=True)
def test_pacore_serve_refuses_a_hostile_model_folder_in_one_line_exit_2(hostile, capsys, monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", _loaded)
    model, named = hostile
    assert main(["serve", "--model", model, "--num-kv-blocks", "8"]) == 2
    _one_line(capsys.readouterr().err, named)


@pytest.mark.parametrize("hostile", ["header-past-the-end"], indirect=True)
def test_a_hostile_model_folder_exits_2_in_one_line_from_a_real_process(hostile):
    model, named = hostile
    proc = subprocess.run([sys.executable, "-m", "pacore", "serve", "--model", model, "--num-kv-blocks", "8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    _one_line(proc.stderr, named)
