"""`pacore run` flags for the paper's setting: --max-tokens auto, --rope-scaling, --shuffle."""
import pytest

from pacore.cli import build_parser
from pacore.cli.run import _config


def _cfg(*flags, command="run"):
    head = ["run", "--data", "d.jsonl", "--out", "o.jsonl"] if command == "run" else ["demo"]
    args = build_parser().parse_args(head + list(flags))
    return _config(args, "d.jsonl", "o.jsonl", False)


def test_max_tokens_defaults_to_auto_with_a_model_and_small_otherwise():
    assert _cfg("--model", "/m").max_tokens == "auto"
    assert _cfg().max_tokens == 512  # the embedded 135M model on a CPU
    assert _cfg(command="demo").max_tokens == 64
    assert _cfg("--model", "/m", command="demo").max_tokens == 64
    assert _cfg("--model", "/m", "--max-tokens", "1000").max_tokens == 1000
    assert _cfg("--max-tokens", "auto").max_tokens == "auto"


@pytest.mark.parametrize("bad", ["0", "-3", "lots", "1.5"])
def test_max_tokens_rejects(bad, capsys):
    with pytest.raises(SystemExit):
        _cfg("--max-tokens", bad)
    assert "expected 'auto' or a positive integer" in capsys.readouterr().err


def test_rope_scaling_json_becomes_an_engine_option():
    cfg = _cfg("--model", "/m", "--max-model-len", "131072", "--rope-scaling",
               '{"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768, "attention_factor": 1.0}')
    assert cfg.engine_options == {"model": "/m", "max_model_len": 131072, "rope_scaling": {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768, "attention_factor": 1.0}}
    assert "rope_scaling" not in _cfg().engine_options


def test_batch_invariant_flag_becomes_an_engine_option():
    assert _cfg("--batch-invariant").engine_options == {"batch_invariant": True}
    assert "batch_invariant" not in _cfg().engine_options
    assert _cfg("--enforce-eager").engine_options == {"enforce_eager": True}


@pytest.mark.parametrize("bad,why", [("{rope_type: yarn}", "not valid JSON"), ("[1, 2]", "non-empty JSON object"),
                                     ("{}", "non-empty JSON object"), ('"yarn"', "non-empty JSON object")])
def test_rope_scaling_must_be_a_json_object(bad, why, capsys):
    with pytest.raises(SystemExit):
        _cfg("--rope-scaling", bad)
    err = capsys.readouterr().err
    assert "--rope-scaling" in err and why in err and '"rope_type": "yarn"' in err


def test_shuffle_defaults_to_the_official_order():
    assert _cfg().shuffle == "official"
    assert _cfg("--shuffle", "seeded").shuffle == "seeded"
    with pytest.raises(SystemExit):
        _cfg("--shuffle", "random")


def test_the_documented_command_reproducing_the_paper_parses_to_its_settings():
    import re
    import shlex
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "pacore-runs.md").read_text()
    section = page.split("## Reproduce the paper", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[0].endswith("pacore")
    args = build_parser().parse_args(argv[1:])
    cfg = _config(args, args.data, args.out, args.resume)
    assert cfg.schedule == (32, 4, 1) and cfg.runs == 64 and cfg.pool == 512 and cfg.shuffle == "official"
    assert cfg.max_tokens == "auto" and (cfg.temperature, cfg.top_p) == (1.0, 1.0)
    assert cfg.engine_options["max_model_len"] == 131072
    # the paper's YaRN scale 2.0 to 131,072 tokens, the same setting as the GPU check's checkpoint
    from bench.gpu.checkpoint import PACORE_YARN, QWEN3_8B
    assert cfg.engine_options["rope_scaling"] == {"rope_type": "yarn", "factor": 2.0,
                                                  "original_max_position_embeddings": 65536, "attention_factor": 1.0}
    assert cfg.engine_options["rope_scaling"] == PACORE_YARN
    assert QWEN3_8B["rope_parameters"] == dict(PACORE_YARN, rope_theta=1e6) and QWEN3_8B["max_position_embeddings"] == 131072
    assert args.data_parallel == 8
