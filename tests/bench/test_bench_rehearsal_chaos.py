"""bench/rehearsal/chaos.py's session: `pacore run` itself on the rehearsed engine (issue 48), at the tiny
shape: it runs, records, and resumes through the real results code."""
import json

import pacore.cli.run as command
from bench.rehearsal.chaos import SPECULATIVE, problems, session
from bench.rehearsal.shapes import model_folder


def test_a_session_is_pacore_run_on_the_rehearsed_engine_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "build_llm", command.build_llm)  # the session swaps it: put back after
    folder = model_folder("tiny", tmp_path / "model")
    data = problems(tmp_path, 2, 64)
    out = tmp_path / "results.jsonl"
    engine = ["--mean-tokens", "40", "--conclusion-tokens", "8", "--kv-tokens", "4096", "--"]
    run = ["--model", str(folder), "--data", str(data), "--out", str(out), "--preset", "low", "--runs", "2",
           "--pool", "8", "--max-tokens", "128", "--no-grade", "--no-progress"]
    with open(data) as f:
        first = f.readline()
    with open(data, "w") as f:  # one problem now, the other on the resume
        f.write(first)
    assert session(engine + run) == 0
    assert "rehearsing a modelled h200" in capsys.readouterr().err
    problems(tmp_path, 2, 64)
    spec = ["--speculative-config", json.dumps(SPECULATIVE[1])]  # self-drafting: the rehearsal's scripted drafts
    assert session(engine + run + ["--resume", *spec]) == 0
    assert "resuming: 1 problem done" in capsys.readouterr().err
    records = [json.loads(line) for line in open(out)]
    assert sorted((r["request_id"], r["run"]) for r in records) == [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)]
    assert all("error" not in r and len(r["round_responses"]) == 2 for r in records)
