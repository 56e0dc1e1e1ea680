"""--runs R and --pool M: independent runs per problem, a round-1 pool drawn without replacement,
mean and std over runs, resume per (problem, run)."""
import statistics

import pytest

from pacore.cli import main
from pacore.results.files import read_results, rounds_path
from pacore.runner import PaCoReRunner
from pacore.evaluate.runs import draw, validate_runs
from pacore_fakes import FakeLLM
from test_pacore_runner import _cfg, _problems


def _run_of(rid: str) -> int:
    part = rid.split("#")[1]
    return int(part[3:]) if part.startswith("run") else 0


def script(prompt, params, rid, i):
    """Round 1: child i answers i; later rounds: the right answer (2*pid) in runs 0 and 1 only."""
    pid = int(rid.split("#")[0][1:])
    if "Reference Responses" not in prompt:
        return f"<think>t{i}</think>\\boxed{{{i}}}" + "." * i  # lengths differ, so the order is not the identity
    return f"<think>c</think>\\boxed{{{2 * pid if _run_of(rid) < 2 else -1}}}"


def _by_run(path):
    return {(r["request_id"], r["run"]): r for r in read_results(path)}


def test_runs_are_independent_records_with_derived_seeds(tmp_path):
    llm = FakeLLM(script)
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=2, runs=3)
    summary = PaCoReRunner(llm, cfg).run()
    recs = _by_run(cfg.out_path)
    assert set(recs) == {(f"p{p}", r) for p in range(2) for r in range(3)}
    seeds = [params.seed for _, _, params in llm.calls]
    assert len(seeds) == len(set(seeds)) == 2 * 3 * 2  # problems x runs x rounds
    # every run of a problem starts from the same round-1 prompt
    firsts = {}
    for rid, ids, _ in llm.calls:
        if rid.endswith("#r1"):
            firsts.setdefault(rid.split("#")[0], set()).add(tuple(ids))
    assert all(len(prompts) == 1 for prompts in firsts.values())
    # run 0 is exactly what a single run computes
    single = tmp_path / "single"
    single.mkdir()
    one = FakeLLM(script)
    PaCoReRunner(one, _cfg(single, rounds=(2,), n_problems=2)).run()
    assert sorted(p.seed for _, _, p in one.calls) == sorted(p.seed for rid, _, p in llm.calls if _run_of(rid) == 0)
    for key, rec in _by_run(str(single / "out.jsonl")).items():
        assert rec["round_responses"] == recs[key]["round_responses"]
    # runs 0 and 1 right, run 2 wrong: pass@1 2/3, std over the runs' accuracies [1, 1, 0]
    assert summary["runs"] == 3 and summary["problems"] == 2 and summary["completed"] == 6
    assert summary["accuracy"] == pytest.approx(2 / 3)
    assert summary["accuracy_std"] == pytest.approx(statistics.stdev([1.0, 1.0, 0.0]))
    assert summary["rounds"][1]["accuracy_std"] == pytest.approx(statistics.stdev([1.0, 1.0, 0.0]))
    assert summary["rounds"][0]["accuracy_std"] == 0.0  # round 1 is the same in every run of this script


def test_pool_is_sampled_once_and_each_run_draws_without_replacement(tmp_path):
    llm = FakeLLM(script)
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=2, runs=4, pool=6)
    summary = PaCoReRunner(llm, cfg).run()
    pool_calls = [(rid, params.n) for rid, _, params in llm.calls if "#pool" in rid]
    assert sorted(pool_calls) == [("p0#pool#r1", 6), ("p1#pool#r1", 6)]
    assert not any(rid.endswith("#r1") and "#pool" not in rid for rid, _, _ in llm.calls)  # no run samples round 1
    recs = _by_run(cfg.out_path)
    assert len(recs) == 8
    pool_tokens = sum(len(script("q", None, "p0#r1", i)) for i in range(6))
    draws = set()
    for (pid, run), rec in recs.items():
        pool = rec["pool"]
        assert pool["size"] == 6 and pool["generated_tokens"] == pool_tokens
        assert pool["indices"] == draw(6, 3, cfg.seed, pid, run)
        assert len(set(pool["indices"])) == 3 and all(0 <= i < 6 for i in pool["indices"])
        round1 = rec["round_responses"][0]
        assert sorted(t["index"] for t in round1) == pool["indices"]
        assert all(t["content"] == script("q", None, "p0#r1", t["index"]) for t in round1)
        s1 = rec["rounds_stats"][0]
        assert s1["pool"] == 6 and s1["k"] == 3 and s1["generated_tokens"] == sum(t["tokens"] for t in round1)
        assert rec["effective_compute_tokens"] == sum(s["generated_tokens"] for s in rec["rounds_stats"])
        draws.add(tuple(pool["indices"]))
    assert len(draws) > 1  # runs draw differently
    # generated once: the two pools plus every run's later rounds; effective: what each run used
    later = sum(s["generated_tokens"] for r in recs.values() for s in r["rounds_stats"][1:])
    assert summary["generated_tokens_total"] == 2 * pool_tokens + later
    assert summary["pool_generated_tokens"] == 2 * pool_tokens
    assert summary["effective_compute_tokens_total"] == sum(r["effective_compute_tokens"] for r in recs.values())
    assert summary["run"]["generated_tokens"] == summary["generated_tokens_total"]


def test_pool_smaller_than_k1_is_refused(tmp_path, capsys):
    cfg = _cfg(tmp_path, rounds=(4,), n_problems=1, pool=3)
    with pytest.raises(ValueError, match="--pool 3 is smaller than round 1's K=4"):
        validate_runs(cfg)
    with pytest.raises(ValueError, match="--pool 3"):
        PaCoReRunner(FakeLLM(script), cfg)
    data = tmp_path / "in.jsonl"
    assert main(["run", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--rounds", "4", "--pool", "3",
                 "--model", str(tmp_path / "no-such-model")]) == 2  # before any model is loaded
    assert "use --pool 4 or more" in capsys.readouterr().err


@pytest.mark.parametrize("pool", [None, 5])
def test_resume_is_per_problem_and_run(tmp_path, pool):
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=3, runs=3, pool=pool, max_problems_in_flight=1)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(script, interrupt_at_step=60), cfg).run()
    first = _by_run(cfg.out_path)
    assert 0 < len(first) < 9
    pools_saved = {r["request_id"] for r in read_results(rounds_path(cfg.out_path)) if r.get("run") == "pool"}
    cfg.resume = True
    llm = FakeLLM(script)
    PaCoReRunner(llm, cfg).run()
    recs = read_results(cfg.out_path)
    assert len(recs) == 9 and len({(r["request_id"], r["run"]) for r in recs}) == 9
    redone = {(rid.split("#")[0], _run_of(rid)) for rid, _, _ in llm.calls if "#pool" not in rid}
    assert not redone & set(first)  # a finished run is never run again
    if pool:  # a pool on disk is drawn from again, not sampled anew
        pooled_again = {rid.split("#")[0] for rid, _, _ in llm.calls if "#pool" in rid}
        assert pools_saved and not pools_saved & pooled_again
        assert pools_saved | pooled_again == {"p0", "p1", "p2"}
    # the same results as a run never stopped
    whole = tmp_path / "whole"
    whole.mkdir()
    _problems(whole / "in.jsonl", 3)
    wcfg = _cfg(whole, rounds=(3,), runs=3, pool=pool)
    PaCoReRunner(FakeLLM(script), wcfg).run()
    assert {k: r["round_responses"] for k, r in _by_run(cfg.out_path).items()} == \
        {k: r["round_responses"] for k, r in _by_run(wcfg.out_path).items()}


@pytest.mark.parametrize("pool", [None, 4])
def test_more_runs_later_run_only_the_new_ones(tmp_path, pool):
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=2, runs=2, pool=pool)
    PaCoReRunner(FakeLLM(script), cfg).run()
    cfg.resume, cfg.runs = True, 3
    llm = FakeLLM(script)
    summary = PaCoReRunner(llm, cfg).run()
    assert {(rid.split("#")[0], _run_of(rid)) for rid, _, _ in llm.calls} == {("p0", 2), ("p1", 2)}
    assert not any("#pool" in rid for rid, _, _ in llm.calls)  # the pools on disk are drawn from
    assert set(_by_run(cfg.out_path)) == {(f"p{p}", r) for p in range(2) for r in range(3)}
    assert summary["runs"] == 3 and summary["completed"] == 6
