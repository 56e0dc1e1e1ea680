"""The `pacore` command line: vLLM's flag names beside ours, `pacore serve MODEL`, a "did you mean"
for a mistyped flag, a short top-level --help, --threads and every flag's default in --help."""
import os
import re

import pytest

from engine.config import engine_kwargs
from pacore.cli import build_parser, main


def _command(name: str):
    return build_parser()._commands[name]


def test_top_level_help_lists_the_commands_one_line_each(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert len(text.splitlines()) < 25  # was every subcommand's help in full: 426 lines
    for command in ("run", "demo", "serve"):
        assert re.search(rf"^ +{command} +\w", text, re.M), command
    assert "--max-problems-in-flight" not in text and "pacore COMMAND --help" in text


@pytest.mark.parametrize("name", ["run", "demo", "serve"])
def test_every_flag_says_its_default(name):
    """Each option of a command's --help, bar switches (off unless given) and `run`'s required paths,
    names its default."""
    switches = {"--help", "--resume", "--skip-failed", "--override-settings", "--record-confidence", "--no-grade",
                "--no-progress", "--batch-invariant", "--enforce-eager", "--data", "--out"}
    missing = []
    for action in _command(name)._actions:
        flags = [o for o in action.option_strings if o.startswith("--")]
        if flags and not set(flags) & switches and "default" not in (action.help or ""):
            missing.append(flags[0])
    assert not missing


def test_run_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = capsys.readouterr().out
    for opt in ["--model", "--data", "--out", "--preset", "--rounds", "--max-tokens", "--seed", "--resume",
                "--max-problems-in-flight", "--dtype", "--profile", "--profile-traces", "--message-token-cap",
                "--threads", "--tensor-parallel-size T, --tensor-parallel T",
                "--data-parallel-size D, --data-parallel D", "--gpu-memory-utilization F"]:
        assert opt in text, opt


@pytest.mark.parametrize("vllm, ours", [("--tensor-parallel-size", "--tensor-parallel"),
                                        ("--data-parallel-size", "--data-parallel")])
def test_vllm_flag_names_and_ours_are_one_flag(vllm, ours):
    base = ["run", "--data", "d", "--out", "o"]
    a, b = (build_parser().parse_args(base + [flag, "2"]) for flag in (vllm, ours))
    assert vars(a) == vars(b)
    assert a.tensor_parallel_size == 2 if "tensor" in vllm else a.data_parallel == 2


def test_gpu_memory_utilization_reaches_the_engine_and_is_checked(capsys):
    for command in (["run", "--data", "d", "--out", "o"], ["serve"]):
        args = build_parser().parse_args(command + ["--gpu-memory-utilization", "0.5"])
        assert engine_kwargs(args)["gpu_memory_utilization"] == 0.5
        assert "gpu_memory_utilization" not in engine_kwargs(build_parser().parse_args(command))  # 0.9: the engine's
        for bad in ("0", "1.5", "x"):
            with pytest.raises(SystemExit):
                build_parser().parse_args(command + ["--gpu-memory-utilization", bad])
            assert "--gpu-memory-utilization" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["run", "--data", "d", "--out", "o", "--tensor-paralel-size", "2"], "did you mean --tensor-parallel-size?"),
    (["serve", "--gpu-memory-utilisation=0.8"], "did you mean --gpu-memory-utilization?"),
    (["demo", "--max-token", "9", "--zzzzzzzzzz"], "see pacore demo --help"),
])
def test_an_unknown_flag_is_named_with_the_nearest_one(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err
    assert err.startswith(f"usage: pacore {argv[0]} ")  # the subcommand's usage, not the top level's


def test_pacore_serve_takes_the_model_positionally():
    from engine.serve.command import model_of

    parse = build_parser().parse_args
    assert model_of(parse(["serve", "/m/PaCoRe-8B", "--port", "9"])) == "/m/PaCoRe-8B"
    assert model_of(parse(["serve", "--model", "/m/x"])) == "/m/x"
    assert model_of(parse(["serve", "/m/x", "--model", "/m/x"])) == "/m/x"
    assert model_of(parse(["serve"])) is None
    with pytest.raises(ValueError, match="two models given"):
        model_of(parse(["serve", "/m/x", "--model", "/m/y"]))
    assert model_of(parse(["serve", "--data-parallel-size", "1"])) is None
    with pytest.raises(ValueError, match="runs one engine"):
        model_of(parse(["serve", "--data-parallel-size", "2"]))


def test_threads_set_what_omp_num_threads_sets(tmp_path, monkeypatch):
    import torch

    import pacore.cli.run as cli_run

    seen = {}
    monkeypatch.setattr(cli_run, "run", lambda args, cfg: seen.update(threads=torch.get_num_threads(),
                                                                      env=os.environ["OMP_NUM_THREADS"]) or 0)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    before = torch.get_num_threads()
    (tmp_path / "p.jsonl").write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    try:
        assert main(["run", "--data", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "r.jsonl"),
                     "--threads", "3"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == {"threads": 3, "env": "3"}  # replicas and TP ranks spawned from here split the 3
    assert build_parser().parse_args(["run", "--data", "d", "--out", "o"]).threads is None  # torch's choice


def test_cpu_replicas_split_omp_num_threads(monkeypatch):
    """`--data-parallel-size D --threads N` on a CPU: each replica gets N // D threads, not cores // D."""
    import pacore.replicas.processes as processes

    seen = []
    monkeypatch.setattr(processes, "spawn_on_pipe", lambda target, args, name, daemon: seen.append(args[3])
                        or (_Proc(), None))
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    replicas = processes.ProcessReplicas(None, None, [None, None, None])  # three on a CPU
    assert seen == [2, 2, 2] and len(replicas.processes) == 3


class _Proc:
    pass


def test_ctrl_c_says_how_to_go_on_for_each_command(tmp_path, capsys):
    """`pacore run` names --resume; bench.rehearsal, which has none, passes its own line."""
    from pacore.runner import run_pacore
    from pacore_fakes import FakeLLM
    from test_pacore_runner import _cfg, default_script

    for i, (message, said) in enumerate([(None, "Run again with --resume"), ("rehearsal: run it again", "it again")]):
        (tmp_path / str(i)).mkdir()
        cfg = _cfg(tmp_path / str(i), n_problems=2)
        with pytest.raises(KeyboardInterrupt):
            run_pacore(FakeLLM(default_script, interrupt_at_step=2), cfg, print_summary=False,
                       **({"interrupted": message} if message else {}))
        err = capsys.readouterr().err
        assert said in err and (message is None or "--resume" not in err)


@pytest.mark.parametrize("argv, said", [(["/m/x", "--model", "/m/y"], "two models given"),
                                        (["--data-parallel-size", "2"], "runs one engine")])
def test_serve_refuses_before_the_model_loads(argv, said, monkeypatch, capsys):
    pytest.importorskip("fastapi")
    import engine

    monkeypatch.setattr(engine, "LLM", lambda *a, **kw: pytest.fail("the model loaded"))
    assert main(["serve", *argv]) == 2
    assert said in capsys.readouterr().err
