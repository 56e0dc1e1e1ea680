"""Data-parallel PaCoRe: replicas in spawned processes share one results file and one summary."""
import dataclasses
import json
import os
import time

import pytest

from pacore.cli import main
from pacore.config import RunConfig
from pacore.io import read_results
from pacore.parallel import ReplicaError, replica_devices, run_data_parallel
from pacore.runner import PaCoReRunner
from pacore.stats import summary_path
from pacore_fakes import FakeLLM
from test_pacore_checkpoint import checkpointed_rounds


def _problems(path, n):
    with open(path, "w") as f:
        for i in range(n):
            rec = {"id": f"p{i}", "messages": [{"role": "user", "content": f"Problem {i}: what is {i}+{i}?"}],
                   "ground_truth": {"answer": str(2 * i)}}
            f.write(json.dumps(rec) + "\n")


def _script(prompt, params, rid, i):
    pid = int(rid.split("#")[0][1:])
    if "Reference Responses" not in prompt:
        return f"<think>try {i}</think>\\boxed{{{2 * pid + (i == 0)}}}"
    return f"<think>compare</think>\\boxed{{{2 * pid}}}"


def _failing_script(prompt, params, rid, i):
    if rid.startswith("p3#"):
        raise RuntimeError("replica broke on p3")
    return _script(prompt, params, rid, i)


def _dying_script(prompt, params, rid, i):
    if rid.startswith("p3#"):
        os._exit(7)  # a kill: no report, no traceback
    return _script(prompt, params, rid, i)


# Builders run inside the replicas (spawned interpreters import this module by name).
def fake_llm(cfg):
    return FakeLLM(_script)


def failing_llm(cfg):
    return FakeLLM(_failing_script)


def dying_llm(cfg):
    return FakeLLM(_dying_script)


def _cfg(tmp_path, n=6, **kw):
    data = tmp_path / "in.jsonl"
    if not data.exists():
        _problems(data, n)
    kw = {"rounds": (3,), **kw}
    return RunConfig(data_path=str(data), out_path=str(tmp_path / "out.jsonl"), max_tokens=64,
                     show_progress=False, **kw)


def _finals(path):
    return {r["request_id"]: r["final_response"] for r in read_results(path)}


def test_replicas_write_every_problem_once_and_one_summary(tmp_path):
    cfg = _cfg(tmp_path)
    t0 = time.time()
    summary = run_data_parallel(cfg, 2, fake_llm)
    elapsed = time.time() - t0
    recs = read_results(cfg.out_path)
    assert sorted(r["request_id"] for r in recs) == [f"p{i}" for i in range(6)]
    assert all("error" not in r for r in recs)
    run = summary["run"]
    assert len(run["replicas"]) == 2
    # the run's time is the replicas' working span: no interpreter start-up or model loading
    assert t0 < min(r["started_at"] for r in run["replicas"]) and run["wall_time_s"] < elapsed
    assert run["generated_tokens"] == sum(r["effective_compute_tokens"] for r in recs)
    assert run["engine_stats"]["prefill_tokens"] == sum(s["engine_stats"]["prefill_tokens"] for s in run["replicas"])
    assert json.loads(open(summary_path(cfg.out_path)).read())["completed"] == 6
    # the same problems on one engine give the same records
    single = tmp_path / "single"
    single.mkdir()
    one = dataclasses.replace(cfg, out_path=str(single / "out.jsonl"))
    PaCoReRunner(FakeLLM(_script), one).run()
    assert _finals(one.out_path) == _finals(cfg.out_path)


def test_a_failed_replica_keeps_what_finished_and_resume_completes(tmp_path):
    cfg = _cfg(tmp_path, max_problems_in_flight=1)
    with pytest.raises(ReplicaError, match=r"1 of 2 replicas failed.*--resume(.|\n)*replica 1:(.|\n)*p3"):
        run_data_parallel(cfg, 2, failing_llm)
    # replica 0 had p0, p2, p4; replica 1 finished p1 before p3 broke it (one problem in flight)
    assert set(_finals(cfg.out_path)) == {"p0", "p1", "p2", "p4"}
    assert os.path.exists(summary_path(cfg.out_path))
    cfg.resume = True
    run_data_parallel(cfg, 2, fake_llm)
    assert sorted(r["request_id"] for r in read_results(cfg.out_path)) == [f"p{i}" for i in range(6)]


def test_a_killed_replica_is_reported(tmp_path):
    cfg = _cfg(tmp_path, max_problems_in_flight=1)
    with pytest.raises(ReplicaError, match="replica 1: exited with code 7 before reporting"):
        run_data_parallel(cfg, 2, dying_llm)
    assert {"p0", "p2", "p4", "p1"} <= set(_finals(cfg.out_path))


def test_more_replicas_than_problems(tmp_path):
    cfg = _cfg(tmp_path, n=1)
    summary = run_data_parallel(cfg, 3, fake_llm)
    assert summary["completed"] == 1 and summary["run"]["engine_stats"]["prefill_tokens"] > 0


def test_one_gpu_per_replica(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert replica_devices(2) == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert replica_devices(1) == ["0"]
    with pytest.raises(ValueError, match="--data-parallel 4 needs 4 GPUs but 2 are visible"):
        replica_devices(4)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert replica_devices(2) == [None, None]


def test_cli_data_parallel_on_a_real_engine(tiny_model_dir, tmp_path, capsys):
    tiny_qwen3 = tiny_model_dir("qwen3")
    _problems(tmp_path / "in.jsonl", 3)
    out = tmp_path / "res.jsonl"
    args = ["run", "--model", str(tiny_qwen3), "--data", str(tmp_path / "in.jsonl"), "--out", str(out),
            "--rounds", "2", "--max-tokens", "6", "--num-kv-blocks", "256", "--no-progress",
            "--data-parallel", "2"]
    assert main(args) == 0
    recs = read_results(str(out))
    assert sorted(r["request_id"] for r in recs) == ["p0", "p1", "p2"]
    assert all("error" not in r and len(r["round_responses"]) == 2 for r in recs)
    summary = json.loads(open(summary_path(str(out))).read())
    assert [s["engine_stats"]["prefill_tokens"] > 0 for s in summary["run"]["replicas"]] == [True, True]
    assert "on 2 replicas" in capsys.readouterr().out


def test_replicas_continue_from_round_checkpoints(tmp_path):
    cfg = _cfg(tmp_path, rounds=(3, 2))
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(_script, interrupt_at_step=30), cfg).run()
    saved = checkpointed_rounds(cfg)
    assert saved
    cfg.resume = True
    run_data_parallel(cfg, 2, fake_llm)
    recs = read_results(cfg.out_path)
    assert sorted(r["request_id"] for r in recs) == [f"p{i}" for i in range(6)]
    for rec in recs:  # the checkpointed rounds were taken over, not run again
        for done in saved.get(rec["request_id"], []):
            assert rec["rounds_stats"][done["round"] - 1] == done["stats"]
