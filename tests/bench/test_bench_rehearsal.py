"""bench.rehearsal: the PaCoRe loop on a rehearsed engine, and a real run's lengths replayed."""
import json

import pytest

from engine import LLM
from pacore.config import RunConfig
from pacore.runner import run_pacore

from bench.rehearsal.__main__ import main, replay_key
from bench.rehearsal.workload import ReplayLengths


def _problems(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Add {i} and {i}."}]}) + "\n")


def _tokens(path):
    out = {}
    for line in open(path):
        rec = json.loads(line)
        for r, rnd in enumerate(rec["round_responses"], start=1):
            for t in rnd:
                out[(rec["request_id"], r, t["index"])] = t["tokens"]
    return out


def test_replayed_lengths_equal_the_results_files(tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("qwen3"))
    _problems(tmp_path / "in.jsonl", 3)
    cfg = dict(rounds=(3,), max_tokens=24, temperature=1.0, grade=False, show_progress=False, seed=5)
    run_pacore(LLM(model, num_kv_blocks=256), RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / "real.jsonl"), **cfg),
               print_summary=False)
    rehearsal = LLM(model, num_kv_blocks=256, device_model="h200")
    rehearsal.sampler.workload = ReplayLengths(tmp_path / "real.jsonl", rehearsal.tokenizer, replay_key)
    run_pacore(rehearsal, RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / "rehearsed.jsonl"), **cfg),
               print_summary=False)
    real, rehearsed = _tokens(tmp_path / "real.jsonl"), _tokens(tmp_path / "rehearsed.jsonl")
    assert len(real) == 3 * (3 + 1) and rehearsed == real


def test_the_command_reports_rounds_baseline_and_host_time(tmp_path):
    out = tmp_path / "r"
    assert main(["--shape", "tiny", "--preset", "low", "--problems", "2", "--prompt-tokens", "64", "--mean-tokens", "300",
                 "--conclusion-tokens", "20", "--kv-tokens", "20000", "--config", "engine", "--config", "no-sharing",
                 "--out", str(out), "--quiet"]) == 0
    engine, baseline = (json.loads((out / n / "report.json").read_text()) for n in ("engine", "no-sharing"))
    assert set(engine["rounds"]) == {"1", "2"} and engine["overall"]["tokens"] == baseline["overall"]["tokens"]
    # fork and the prefix cache prefill each round-1 prompt once; the baseline prefills it K times
    assert engine["prefill_tokens"] < baseline["prefill_tokens"]
    assert engine["overall"]["limit_tokens_per_s"] >= engine["overall"]["tokens_per_s"] > 0
    assert engine["host_ms_per_step"] > 0 and (out / "rehearsal.png").stat().st_size > 0
    assert "| engine | 1 |" in (out / "table.md").read_text()


def test_the_command_replays_a_results_file_by_its_own_problem_ids(tmp_path, capsys):
    # issue 28: --replay wrote the rehearsal's own ids (p0, p1, ...), so a real run's file matched none
    # of them and every problem became an error record (exit 0)
    def trajectory(i, tokens):
        return {"content": "</think> 7", "index": i, "finish_reason": "stop", "tokens": tokens}
    real = tmp_path / "real.jsonl"
    real.write_text("".join(json.dumps({"request_id": pid, "run": 0, "round_responses": [
        [trajectory(i, 40 + 10 * i) for i in range(4)], [trajectory(0, 30)]]}) + "\n" for pid in ("apples", "pencils")))
    out = tmp_path / "r"
    common = ["--shape", "tiny", "--replay", str(real), "--kv-tokens", "20000", "--out", str(out), "--quiet"]
    assert main(common + ["--preset", "high"]) == 2
    assert ("no trajectory for problem apples round 1 index 4 (it recorded rounds of K=[4, 1]); replay with the "
            "--preset the run used (--preset high is K=[32, 4, 1])") in capsys.readouterr().err
    assert main(common + ["--preset", "low"]) == 0
    records = [json.loads(line) for line in (out / "engine" / "results.jsonl").read_text().splitlines()]
    assert [r["request_id"] for r in records] == ["apples", "pencils"] and not any("error" in r for r in records)
    assert _tokens(out / "engine" / "results.jsonl")[("pencils", 1, 3)] == 70


def test_host_time_counts_self_drafting(tmp_path):
    """bench.rehearsal.host with self-drafting: its draft steps' host work has its own column, and the
    modelled device step includes the draft steps."""
    from bench.rehearsal.host import filled_engine, measure
    spec = {"method": "self_window", "num_speculative_tokens": 3, "window": 64, "sink": 4, "policy": "fixed"}
    plain = measure(filled_engine(4, 1000, tmp_path, shape="tiny"), steps=8)
    llm = filled_engine(4, 1000, tmp_path, shape="tiny", speculative_config=spec)
    m = measure(llm, steps=8)
    assert plain["draft_ms"] == 0 and m["draft_ms"] > 0
    assert m["host_ms"] == pytest.approx(m["schedule_ms"] + m["prepare_ms"] + m["sample_ms"] + m["draft_ms"])
    assert m["device_ms"] > plain["device_ms"]  # three draft steps and a verify pass of four queries per step
    assert llm.stats()["spec_decode_num_draft_tokens"] >= 8 * 4 * 3
    assert llm.speculator.draft_with_model.__func__ is type(llm.speculator).draft_with_model  # unwrapped again
