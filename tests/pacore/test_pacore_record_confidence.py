"""`pacore run --record-confidence`: the measures beside each trajectory's tokens, through snapshots,
resume and replicas, and the summary's confidence against correctness (on the scripted engine)."""
import json

import pytest
import torch

from engine.llm import StepError
from pacore.cli import main
from pacore.evaluate.confidence import MEASURES, TOP_K, auroc, trajectory_confidence
from pacore.evaluate.summary import format_summary
from pacore.replicas.driver import ReplicaError
from pacore.replicas.processes import run_data_parallel
from pacore.results.files import read_results, rounds_path
from pacore.results.snapshots import SnapshotStore
from pacore.runner import PaCoReRunner
from pacore_fakes import FakeLLM, fake_logprobs
from test_pacore_checkpoint import killed_llm
from test_pacore_runner import _cfg, default_script


def _measures(path):
    """Problem -> per round, each trajectory's (content, mean_logprob, lowest_group_confidence)."""
    return {r["request_id"]: [[(t["content"], t.get("mean_logprob"), t.get("lowest_group_confidence")) for t in rnd]
                              for rnd in r["round_responses"]] for r in read_results(path)}


def test_off_by_default_nothing_new_is_asked_or_recorded(tmp_path):
    llm = FakeLLM(default_script)
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=2)
    assert cfg.record_confidence is False
    summary = PaCoReRunner(llm, cfg).run()
    assert all(params.logprobs is None for _, _, params in llm.calls)
    for rec in read_results(cfg.out_path):
        for rnd in rec["round_responses"]:
            assert all(set(t) == {"content", "reasoning_content", "index", "finish_reason", "tokens"} for t in rnd)
        assert all("correct" not in s for s in rec["rounds_stats"])
    assert all("confidence" not in r for r in summary["rounds"])
    assert "confidence of a trajectory" not in format_summary(summary)


def test_each_trajectory_records_its_measures_and_the_summary_relates_them_to_correctness(tmp_path):
    llm = FakeLLM(default_script)
    cfg = _cfg(tmp_path, rounds=(4,), n_problems=3, record_confidence=True)
    summary = PaCoReRunner(llm, cfg).run()
    assert all(params.logprobs == TOP_K for _, _, params in llm.calls)
    right, wrong = {m: [] for m in MEASURES}, {m: [] for m in MEASURES}
    for rec in read_results(cfg.out_path):
        r1 = rec["round_responses"][0]
        for t in r1:
            assert list(t)[4:] == ["tokens", "mean_logprob", "lowest_group_confidence"]  # beside its tokens
            want = trajectory_confidence(fake_logprobs(t["content"], TOP_K))
            assert (t["mean_logprob"], t["lowest_group_confidence"]) == (want.mean_logprob,
                                                                          want.lowest_group_confidence)
        # child 0 answers wrong in round 1 (default_script); `correct` lines up with round_responses
        assert rec["rounds_stats"][0]["correct"] == [t["index"] != 0 for t in r1]
        for t, ok in zip(r1, rec["rounds_stats"][0]["correct"]):
            for m in MEASURES:
                (right if ok else wrong)[m].append(t[m])
    c1, c2 = summary["rounds"][0]["confidence"], summary["rounds"][1]["confidence"]
    assert (c1["correct"], c1["incorrect"]) == (9, 3)
    for m in MEASURES:
        assert c1[m]["correct_mean"] == pytest.approx(sum(right[m]) / 9)
        assert c1[m]["incorrect_mean"] == pytest.approx(sum(wrong[m]) / 3)
        assert c1[m]["auroc"] == auroc(right[m], wrong[m])
    assert (c2["correct"], c2["incorrect"]) == (3, 0) and c2["mean_logprob"]["auroc"] is None
    text = format_summary(summary)
    assert "confidence of a trajectory vs its correctness" in text
    row = next(line for line in text.splitlines() if line.split()[:3] == ["1", "9", "3"])
    assert f"{c1['mean_logprob']['auroc']:.2f}" in row


def test_without_grading_the_measures_are_recorded_but_not_related(tmp_path):
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=1, record_confidence=True, grade=False)
    summary = PaCoReRunner(FakeLLM(default_script), cfg).run()
    rec = read_results(cfg.out_path)[0]
    assert all(t["mean_logprob"] is not None for t in rec["round_responses"][0])
    assert "correct" not in rec["rounds_stats"][0] and "confidence" not in summary["rounds"][0]


def test_a_pool_passes_its_measures_on_to_the_runs_drawing_from_it(tmp_path):
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=1, record_confidence=True, pool=4, runs=2)
    PaCoReRunner(FakeLLM(default_script), cfg).run()
    pool = [json.loads(x) for x in open(rounds_path(cfg.out_path))][0]
    by_index = {t["index"]: t for t in pool["responses"]}
    for rec in read_results(cfg.out_path):
        for t in rec["round_responses"][0]:
            assert t == by_index[t["index"]] and t["mean_logprob"] is not None


def test_ctrl_c_mid_round_resumes_with_the_snapshots_logprobs(tmp_path):
    (tmp_path / "a").mkdir()
    cfg = _cfg(tmp_path / "a", rounds=(3,), n_problems=2, max_problems_in_flight=2, checkpoint_every_s=0,
               record_confidence=True)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(default_script, interrupt_at_step=10), cfg).run()
    cfg.resume = True
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert sorted(llm.resumed_logprobs) == ["p0#r1", "p1#r1"]
    for rid, children in llm.resumed_logprobs.items():  # each child's 10 positions, as they were
        assert [len(lp) for lp in children] == [10, 10, 10]
        assert children[1] == fake_logprobs(default_script("", None, rid, 1)[:10], TOP_K)
    (tmp_path / "b").mkdir()
    whole = _cfg(tmp_path / "b", rounds=(3,), n_problems=2, record_confidence=True)
    PaCoReRunner(FakeLLM(default_script), whole).run()
    assert _measures(cfg.out_path) == _measures(whole.out_path)  # exact: from the snapshot


def scripted_llm(cfg):
    return FakeLLM(default_script)


def test_a_run_killed_mid_round_and_resumed_gives_the_measures_of_one_never_killed(tmp_path):
    (tmp_path / "a").mkdir()
    cfg = _cfg(tmp_path / "a", rounds=(3,), n_problems=2, max_problems_in_flight=2, checkpoint_every_s=1e-6,
               record_confidence=True)
    with pytest.raises(ReplicaError, match="exited with code 9"):
        run_data_parallel(cfg, 1, killed_llm)  # its snapshots travel to the driver as events
    assert all("logprobs" in SnapshotStore(cfg.out_path).read(f"p{i}", 1) for i in range(2))
    cfg.resume = True
    run_data_parallel(cfg, 1, scripted_llm)  # the driver ships the snapshots, logprobs too, to the replica
    (tmp_path / "b").mkdir()
    whole = _cfg(tmp_path / "b", rounds=(3,), n_problems=2, record_confidence=True)
    run_data_parallel(whole, 1, scripted_llm)  # records as a replica's events, too
    # exact: the scripted engine recomputes logprobs 1e-6 off, so these are the snapshot's
    assert _measures(cfg.out_path) == _measures(whole.out_path)


def test_a_snapshot_taken_without_logprobs_still_resumes_and_the_engine_recomputes_them(tmp_path):
    (tmp_path / "a").mkdir()
    cfg = _cfg(tmp_path / "a", rounds=(3,), n_problems=2, max_problems_in_flight=2, checkpoint_every_s=0)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(default_script, interrupt_at_step=10), cfg).run()
    cfg.resume, cfg.record_confidence = True, True
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert sorted(llm.resumed) == ["p0#r1", "p1#r1"] and llm.resumed_logprobs == {}
    (tmp_path / "b").mkdir()
    whole = _cfg(tmp_path / "b", rounds=(3,), n_problems=2, record_confidence=True)
    PaCoReRunner(FakeLLM(default_script), whole).run()
    got, want = _measures(cfg.out_path), _measures(whole.out_path)
    assert got != want and got.keys() == want.keys()  # recomputed: 1e-6 off
    for pid in got:
        for rnd_got, rnd_want in zip(got[pid], want[pid], strict=True):
            for (text, *m), (text_want, *m_want) in zip(rnd_got, rnd_want, strict=True):
                assert text == text_want and m == pytest.approx(m_want, abs=1e-5)


def _short_first_child(prompt, params, rid, i):
    return "\\boxed{0}" if i == 0 and "Reference Responses" not in prompt else default_script(prompt, params, rid, i)


def test_a_snapshot_without_logprobs_whose_child_had_finished_starts_its_round_over(tmp_path, capsys):
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=1, checkpoint_every_s=0)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(_short_first_child, interrupt_at_step=12), cfg).run()
    assert SnapshotStore(cfg.out_path).read("p0", 1)["finish_reasons"][0] == "stop"  # child 0: 9 tokens
    cfg.resume, cfg.record_confidence = True, True
    llm = FakeLLM(_short_first_child)
    PaCoReRunner(llm, cfg).run()
    # its logprobs cannot be recomputed (it never runs again): the round starts over, said in the CLI's
    # terms (issue 31, item 12), not the engine API's (resume_logprobs[0])
    err = capsys.readouterr().err
    assert "trajectory 0 had finished" in err and "--record-confidence" in err and llm.resumed == {}
    assert "resume_logprobs" not in err and "resume[0]" not in err
    assert all(t["mean_logprob"] is not None for t in read_results(cfg.out_path)[0]["round_responses"][0])


def test_a_snapshot_with_logprobs_resumes_a_round_that_asks_for_none(tmp_path):
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=1, checkpoint_every_s=0, record_confidence=True)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(default_script, interrupt_at_step=10), cfg).run()
    cfg.resume, cfg.record_confidence = True, False
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert llm.resumed == {"p0#r1": [10, 10, 10]} and llm.resumed_logprobs == {}
    assert "mean_logprob" not in read_results(cfg.out_path)[0]["round_responses"][0][0]


def test_snapshot_files_keep_logprobs_and_drop_only_those_that_cannot_be_read(tmp_path, capsys):
    store = SnapshotStore(str(tmp_path / "r.jsonl"))
    lps = [fake_logprobs("ab", TOP_K), None]
    store.save("p", 1, 2, 0, [1, 2, 3], [([97, 98], None), ([], None)], lps)
    rec = store.read("p", 1)
    assert rec["logprobs"] == lps
    assert store.load("p", 1, 2, 0, [1, 2, 3]) == [([97, 98], None), ([], None)]
    saved = torch.load(store._path("p", 1), weights_only=True)  # on disk: tensors only
    saved["logprobs"][0]["top_logprobs"] = torch.zeros(3)
    torch.save(saved, store._path("p", 1))
    rec = store.read("p", 1)
    assert "logprobs" not in rec and rec["tokens"][0].tolist() == [97, 98]
    assert "recomputes" in capsys.readouterr().err
    store.save("p", 1, 2, 0, [1, 2, 3], [([97, 98], None), ([], None)], [None, None])
    assert "logprobs" not in store.read("p", 1)  # the round asked for none


def test_an_engine_step_that_fails_keeps_the_logprobs_of_the_rounds_it_aborted(tmp_path):
    class FailingLLM(FakeLLM):
        def step(self):
            if len(self.step_log) == 6:
                self.step_log.append(set())
                partial = {rid: self.partial_outputs(rid) for rid in self._active}
                logprobs = {rid: self.partial_logprobs(rid) for rid in self._active}
                self._active.clear()
                raise StepError(partial, RuntimeError("device lost"), logprobs)
            return super().step()

    cfg = _cfg(tmp_path, rounds=(2,), n_problems=1, record_confidence=True)
    PaCoReRunner(FailingLLM(default_script), cfg).run()
    assert "device lost" in read_results(cfg.out_path)[0]["error"]
    assert [len(lp) for lp in SnapshotStore(cfg.out_path).read("p0", 1)["logprobs"]] == [6, 6]
    cfg.resume = True
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert [len(lp) for lp in llm.resumed_logprobs["p0#r1"]] == [6, 6]
    assert "error" not in read_results(cfg.out_path)[-1]


def test_the_engine_must_be_allowed_top_20_logprobs(tmp_path, capsys):
    with pytest.raises(ValueError, match="--max-logprobs 20 or more"):
        _cfg(tmp_path, record_confidence=True, engine_options={"max_logprobs": 5})
    data = tmp_path / "in.jsonl"
    assert main(["run", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--record-confidence",
                 "--max-logprobs", "5"]) == 2
    assert "--max-logprobs 20 or more" in capsys.readouterr().err


def test_run_and_demo_take_the_flag_and_it_is_off_by_default(tmp_path):
    from pacore.cli import build_parser
    from pacore.cli.run import _config

    parser = build_parser()
    for argv in (["run", "--data", "d", "--out", "o"], ["demo"]):
        assert parser.parse_args(argv).record_confidence is False
        args = parser.parse_args(argv + ["--record-confidence"])
        assert _config(args, "d", str(tmp_path / "o"), resume=False).record_confidence is True


def test_old_records_read_back_as_before_and_bad_measures_are_refused():
    from pacore.results.shapes import trajectory

    old = {"content": "x", "index": 0, "finish_reason": "stop", "tokens": 3}
    assert trajectory(old, 0).confidence is None and trajectory(old, 0).to_record() == {**old, "reasoning_content": ""}
    new = {**old, "mean_logprob": -0.5, "lowest_group_confidence": None}
    assert trajectory(new, 0).to_record() == {**new, "reasoning_content": ""}
    for bad in ("high", float("nan"), True):
        assert trajectory({**old, "mean_logprob": bad, "lowest_group_confidence": 1.0}, 0) is None
