"""Checkpoints: a resumed problem continues at the round after its last finished one, and a round
in flight continues each trajectory where its last snapshot left it."""
import json
import os

import pytest

from pacore.config import RunConfig
from pacore.evaluate.stats import RoundStats
from pacore.replicas.driver import ReplicaError
from pacore.results.resume import OutputExistsError, PriorResults, prepare_output
from pacore.results.files import snapshot_dir, read_results, rounds_path
from pacore.replicas.processes import run_data_parallel
from pacore.results.snapshots import SnapshotStore
from pacore.results.problems import Problem, read_problems
from pacore.runner import PaCoReRunner
from pacore.results.resume import read_prior_work
from pacore_fakes import FakeLLM
from test_pacore_runner import _cfg, default_script


def checkpointed_rounds(cfg) -> dict[str, list[dict]]:
    """Problem key -> run 0's checkpointed rounds 1..r, as --resume reads them."""
    todo = [p for p in read_problems(cfg.data_path) if isinstance(p, Problem)]
    return {k: w.rounds[0] for k, w in read_prior_work(cfg, todo, PriorResults()).items() if 0 in w.rounds}


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
    saved = checkpointed_rounds(cfg)
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
    assert checkpointed_rounds(cfg)
    cfg.seed, cfg.override_settings = 1, True  # refused without it (results/settings.py)
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert all(rounds == [1, 2, 3] for rounds in _rounds_called(llm).values())
    assert "starting it over" in capsys.readouterr().err


def test_a_checkpoint_file_alone_needs_resume(tmp_path):
    out = tmp_path / "r.jsonl"
    (tmp_path / "r.jsonl.rounds.jsonl").write_text('{"request_id": "a", "round": 1}\n{"request_id": "a", "rou')
    with pytest.raises(OutputExistsError, match="rounds.jsonl already holds results.*--resume"):
        prepare_output(str(out), resume=False)
    assert prepare_output(str(out), resume=True).done == set()
    assert open(rounds_path(str(out))).read() == '{"request_id": "a", "round": 1}\n'  # torn line cut


def test_only_contiguous_rounds_count(tmp_path):
    out = str(tmp_path / "r.jsonl")
    stats = RoundStats(1, 1, 5, 3, 0.1, 0.1, 15.0, 0, 0, 0, 0, 0).to_dict()
    shaped = {"k": 1, "seed": 0, "shuffle": "official", "pool": None, "stats": stats,
              "responses": [{"content": "x", "index": 0, "finish_reason": "stop", "tokens": 3}]}
    with open(rounds_path(out), "w") as f:
        for pid, r in ((7, 1), ("7", 3), ("b", 2)):
            f.write(json.dumps({"request_id": pid, "round": r, **shaped}) + "\n")
    data = tmp_path / "in.jsonl"
    data.write_text("".join(f'{{"id": {i}, "messages": [{{"role": "user", "content": "q"}}]}}\n' for i in ('7', '"b"')))
    cfg = RunConfig(str(data), out, rounds=(3, 2))
    assert {k: [r["round"] for r in v] for k, v in checkpointed_rounds(cfg).items()} == {"7": [1]}


# -- snapshots of the rounds in flight (pacore/partial.py) --------------------------------------------
class _KilledLLM(FakeLLM):
    """Dies like a killed process (no exception, no cleanup) at step 12."""

    def step(self):
        if len(self.step_log) >= 12:
            os._exit(9)
        return super().step()


def killed_llm(cfg):  # built inside a spawned replica
    return _KilledLLM(default_script)


def test_ctrl_c_mid_round_resumes_every_trajectory_where_it_stopped(tmp_path):
    (tmp_path / "a").mkdir()
    cfg = _cfg(tmp_path / "a", rounds=(3,), n_problems=3, max_problems_in_flight=3, checkpoint_every_s=0)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(default_script, interrupt_at_step=10), cfg).run()
    assert len(os.listdir(snapshot_dir(cfg.out_path))) == 3  # one snapshot per round in flight
    cfg.resume = True
    llm = FakeLLM(default_script)
    summary = PaCoReRunner(llm, cfg).run()
    assert llm.resumed == {f"p{i}#r1": [10, 10, 10] for i in range(3)}
    assert not os.path.lexists(snapshot_dir(cfg.out_path))  # a finished round drops its snapshot; the empty folder goes
    assert summary["run"]["generated_tokens"] == summary["effective_compute_tokens_total"] - 3 * 3 * 10
    for rec in read_results(cfg.out_path):  # a resumed round's tokens/s counts this session's tokens only
        r1 = rec["rounds_stats"][0]
        elapsed = r1["prefill_time_s"] + r1["decode_time_s"]
        # times are rounded to 1 us on rounds of ~0.3 ms: ask which count it is nearer to
        this_session, all_tokens = (r1["generated_tokens"] - 30) / elapsed, r1["generated_tokens"] / elapsed
        assert abs(r1["tokens_per_s"] - this_session) < abs(r1["tokens_per_s"] - all_tokens) / 5
    (tmp_path / "b").mkdir()
    whole = _cfg(tmp_path / "b", rounds=(3,), n_problems=3, max_problems_in_flight=3)
    PaCoReRunner(FakeLLM(default_script), whole).run()
    assert _comparable(cfg.out_path) == _comparable(whole.out_path)


def test_periodic_snapshots_survive_a_kill(tmp_path):
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=2, max_problems_in_flight=2, checkpoint_every_s=1e-6)
    with pytest.raises(ReplicaError, match="exited with code 9"):
        run_data_parallel(cfg, 1, killed_llm)
    assert len(os.listdir(snapshot_dir(cfg.out_path))) == 2
    cfg.resume = True
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert sorted(llm.resumed) == ["p0#r1", "p1#r1"]
    assert all(n >= 10 for lengths in llm.resumed.values() for n in lengths)
    assert sorted(r["request_id"] for r in read_results(cfg.out_path)) == ["p0", "p1"]


def test_a_snapshot_only_fits_its_own_round(tmp_path):
    store = SnapshotStore(str(tmp_path / "r.jsonl"))
    store.save("p", 1, 2, 0, [1, 2, 3], [([4, 5], None), ([6], "stop")])
    assert store.load("p", 1, 2, 0, [1, 2, 3]) == [([4, 5], None), ([6], "stop")]
    assert store.load("p", 1, 2, 0, [1, 2]) is None       # another prompt
    assert store.load("p", 1, 2, 1, [1, 2, 3]) is None    # another seed
    assert store.load("p", 1, 3, 0, [1, 2, 3]) is None    # another K
    assert store.load("p", 2, 2, 0, [1, 2, 3]) is None    # another round
    with pytest.raises(OutputExistsError, match="partial already holds results"):
        prepare_output(str(tmp_path / "r.jsonl"), resume=False)
    store.drop("p", 1)
    assert prepare_output(str(tmp_path / "r.jsonl"), resume=False).done == set()


def _breaks_on_p1_round2(prompt, params, rid, i):
    if rid == "p1#r2":
        raise RuntimeError("driver bug on p1")
    text = default_script(prompt, params, rid, i)
    return text + "x" * 40 if rid.startswith("p9#") else text  # p9 is still decoding when p1 breaks


def test_an_error_mid_step_still_snapshots_what_is_running(tmp_path):
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=10, max_problems_in_flight=10, checkpoint_every_s=0)
    with pytest.raises(RuntimeError, match="driver bug on p1"):
        PaCoReRunner(FakeLLM(_breaks_on_p1_round2), cfg).run()
    # p0..p4 finished round 1 in one step (texts of one length); p1 broke the driver, so p2..p4 were
    # never handled and the engine no longer has them: skipped. p5..p9 (longer texts) were decoding
    # round 1: saved. p0's round 2 had no token yet: nothing to save.
    assert sorted(os.listdir(snapshot_dir(cfg.out_path))) == sorted(
        os.path.basename(SnapshotStore(cfg.out_path)._path(f"p{i}", 1)) for i in range(5, 10))
