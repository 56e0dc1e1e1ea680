"""Round checkpoints: a resumed problem continues at the round after its last finished one."""
import pytest

from pacore.io import OutputExistsError, prepare_output, read_results, read_round_checkpoints, rounds_path
from pacore.runner import PaCoReRunner
from pacore_fakes import FakeLLM
from test_pacore_runner import _cfg, default_script


def _interrupted(tmp_path, step, **kw):
    cfg = _cfg(tmp_path, rounds=(3, 2), n_problems=4, max_problems_in_flight=4, **kw)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(default_script, interrupt_at_step=step), cfg).run()
    cfg.resume = True
    return cfg


def _rounds_called(llm):
    called = {}
    for rid, _, _ in llm.calls:
        pid, r = rid.split("#r")
        called.setdefault(pid, []).append(int(r))
    return called


def _comparable(path):
    return {r["request_id"]: (r["final_response"], r["round_responses"], [s["answers"] for s in r["rounds_stats"]])
            for r in read_results(path)}


def test_resume_continues_at_the_next_round_with_the_same_results(tmp_path):
    (tmp_path / "a").mkdir()
    cfg = _interrupted(tmp_path / "a", step=40)
    saved = read_round_checkpoints(cfg.out_path)
    assert saved and not read_results(cfg.out_path)  # rounds finished, no problem yet
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    for pid, rounds in _rounds_called(llm).items():
        assert rounds == list(range(len(saved.get(pid, [])) + 1, 4)), (pid, rounds)
    # round 1's stats are the checkpointed ones, not a rerun
    for rec in read_results(cfg.out_path):
        for done in saved.get(rec["request_id"], []):
            assert rec["rounds_stats"][done["round"] - 1] == done["stats"]
    (tmp_path / "b").mkdir()
    whole = _cfg(tmp_path / "b", rounds=(3, 2), n_problems=4, max_problems_in_flight=4)
    PaCoReRunner(FakeLLM(default_script), whole).run()
    assert _comparable(cfg.out_path) == _comparable(whole.out_path)


def test_checkpoints_of_another_seed_are_not_used(tmp_path, capsys):
    cfg = _interrupted(tmp_path, step=40)
    assert read_round_checkpoints(cfg.out_path)
    cfg.seed = 1
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert all(rounds == [1, 2, 3] for rounds in _rounds_called(llm).values())
    assert "starting it over" in capsys.readouterr().err


def test_a_checkpoint_file_alone_needs_resume(tmp_path):
    out = tmp_path / "r.jsonl"
    (tmp_path / "r.jsonl.rounds.jsonl").write_text('{"request_id": "a", "round": 1}\n{"request_id": "a", "rou')
    with pytest.raises(OutputExistsError, match="rounds.jsonl already holds results.*--resume"):
        prepare_output(str(out), resume=False)
    assert prepare_output(str(out), resume=True) == set()
    assert open(rounds_path(str(out))).read() == '{"request_id": "a", "round": 1}\n'  # torn line cut


def test_only_contiguous_rounds_count(tmp_path):
    out = str(tmp_path / "r.jsonl")
    with open(rounds_path(out), "w") as f:
        f.write('{"request_id": 7, "round": 1}\n{"request_id": "7", "round": 3}\n{"request_id": "b", "round": 2}\n')
    assert {k: [r["round"] for r in v] for k, v in read_round_checkpoints(out).items()} == {"7": [1]}
