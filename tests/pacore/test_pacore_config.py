import pytest

from pacore.cli import build_parser
from pacore.cli.run import _config
from pacore.config import PRESETS, RunConfig, parse_rounds, round_schedule


def test_presets_match_the_paper():
    assert PRESETS == {"low": (4,), "medium": (16,), "high": (32, 4)}
    assert round_schedule(PRESETS["high"]) == (32, 4, 1)
    assert round_schedule(PRESETS["low"]) == (4, 1)


def test_final_round_always_appended():
    assert round_schedule([4, 1]) == (4, 1, 1)
    assert round_schedule([]) == (1,)
    assert RunConfig("d", "o", rounds=(8, 2)).schedule == (8, 2, 1)


@pytest.mark.parametrize("bad", ["", "a", "4,0", "-1", "3,,x"])
def test_parse_rounds_rejects(bad):
    with pytest.raises(ValueError):
        parse_rounds(bad)


def test_parse_rounds():
    assert parse_rounds("32,4") == (32, 4)
    assert parse_rounds(" 16 ") == (16,)


def test_cli_options_to_config(tmp_path):
    args = build_parser().parse_args(["run", "--data", "d.jsonl", "--out", "o.jsonl", "--rounds", "8,2",
                                      "--max-tokens", "64", "--seed", "7", "--message-token-cap", "none",
                                      "--profile", "prof", "--dtype", "float32", "--max-problems-in-flight", "3"])
    cfg = _config(args, args.data, args.out, args.resume)
    assert cfg.rounds == (8, 2) and cfg.schedule == (8, 2, 1)
    assert cfg.max_tokens == 64 and cfg.seed == 7 and cfg.message_token_cap is None
    assert cfg.profile_dir == "prof" and cfg.engine_options == {"dtype": "float32"}
    assert cfg.max_problems_in_flight == 3
    assert cfg.to_dict()["schedule"] == [8, 2, 1]
    args = build_parser().parse_args(["run", "--data", "d", "--out", "o", "--preset", "high"])
    assert _config(args, "d", "o", False).rounds == (32, 4)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--data", "d", "--out", "o", "--preset", "high", "--rounds", "2"])

