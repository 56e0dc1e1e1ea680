"""The `pacore` command line: vLLM's flag names beside ours, `pacore serve MODEL`, a "did you mean"
for a mistyped flag, a short top-level --help, --threads and every flag's default in --help."""
import json
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
    from engine.serve.command import NO_OP_FLAGS, REFUSED_FLAGS
    switches |= set(NO_OP_FLAGS) | set(REFUSED_FLAGS)  # vLLM's flags taken as switches, or refused
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


def test_vllms_serve_flags_are_taken_with_vllms_meaning():
    # issue 47: each of these was refused as unknown
    from engine.serve.command import SERVE_FLAGS

    args = build_parser().parse_args([
        "serve", "--kv-cache-dtype", "fp8", "--dtype", "half", "--no-enable-prefix-caching",
        "--max-num-batched-tokens", "4096", "--block-size", "32", "--tokenizer", "/t", "--chat-template", "t.jinja",
        "--generation-config", "vllm", "--disable-log-requests", "--enable-chunked-prefill", "--trust-remote-code"])
    assert engine_kwargs(args, SERVE_FLAGS) == {
        "kv_cache_dtype": "fp8_e4m3", "dtype": "float16", "enable_prefix_caching": False,
        "max_num_batched_tokens": 4096, "block_size": 32, "tokenizer": "/t"}
    assert (args.chat_template, args.generation_config) == ("t.jinja", "vllm")
    on = build_parser().parse_args(["serve", "--enable-prefix-caching", "--dtype", "float"])
    assert engine_kwargs(on, SERVE_FLAGS) == {"dtype": "float32"}  # prefix caching is on by default
    assert build_parser().parse_args(["serve"]).generation_config == "auto"  # vLLM's default


@pytest.mark.parametrize("argv, said", [
    (["serve", "--swap-space", "4"], "--swap-space is vLLM's flag, not taken here: a preempted sequence is recomputed"),
    (["serve", "--enable-lora"], "LoRA adapters are not supported"),
    (["serve", "--reasoning-parser", "qwen3"], "no reasoning parser"),
    (["serve", "--block-size", "24"], "invalid choice: 24"),
    (["serve", "--kv-cache-dtype", "fp4"], "invalid choice: 'fp4'"),
])
def test_vllm_flags_without_a_meaning_here_are_refused_naming_why(argv, said, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["serve", "--max-model", "abc"], "unrecognized flag --max-model: did you mean --max-model-len?"),  # no abbreviations
    (["run", "--max-model", "12", "--data", "d", "--out", "o"], "unrecognized flag --max-model: did you mean"),
    (["run", "--max-model-length", "100"], "unrecognized flag --max-model-length: did you mean --max-model-len?"),
    (["run", "--data", "d", "--out", "o", "--generation-config", "x"], "--generation-config: see pacore run --help"),
    # a flag with a word more is another flag, not a typo of the shorter one (issue 52)
    (["serve", "--tokenizer-mode", "slow"], "unrecognized flag --tokenizer-mode: see pacore serve --help"),
])
def test_an_unknown_flag_is_named_first_with_close_names_only(argv, said, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert said in err and "required" not in err, err  # not "the following arguments are required: --data"


def test_generation_config_and_chat_template_read_as_vllm_reads_them(tmp_path):
    from engine.serve import protocol as api
    from engine.serve.command import chat_template, generation_defaults

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 1, "max_new_tokens": 99}))
    defaults = generation_defaults(str(tmp_path), None)
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert generation_defaults("auto", str(tmp_path)) == defaults and generation_defaults("vllm", str(tmp_path)) == {}
    with pytest.raises(ValueError, match="no generation_config.json"):
        generation_defaults(str(tmp_path / "none"), None)
    body = api.CompletionRequest(model="m", prompt="x", top_p=0.5)
    params = body.sampling_params(16, api.Limits(20), defaults)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.6, 0.5, 20, 0.0)  # the request's top_p
    assert body.sampling_params(16, api.Limits(20)).temperature == 1.0  # OpenAI's without defaults
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    assert chat_template(str(tmp_path / "t.jinja")) == chat_template("{{ messages[0]['content'] }}")
    with pytest.raises(ValueError, match="no such file"):
        chat_template(str(tmp_path / "missing.jinja"))
