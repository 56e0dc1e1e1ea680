"""Data-parallel PaCoRe on local processes: the parent hands problems to whichever replica has room and
alone writes the results; a replica that dies hands its problems back (pacore/dispatch.py)."""
import dataclasses
import fcntl
import json
import multiprocessing
import os
import signal
import time

import pytest

from pacore.cli import main
from pacore.config import RunConfig
from pacore.replicas.driver import ReplicaError
from pacore.results.files import snapshot_dir, read_results
from pacore.results.lock import lock_path
from pacore.replicas.processes import replica_devices, run_data_parallel
from pacore.runner import PaCoReRunner
from pacore.results.files import summary_path
from pacore_fakes import FakeLLM


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


def _successes(path):
    return sorted(r["request_id"] for r in read_results(path) if "error" not in r)


def _comparable(path):
    """Each record's content, without what depends on timing or on what else shared the engine."""
    return {(r["request_id"], r.get("run", 0)): (r["final_response"], r["round_responses"],
                                                 [(s["k"], s["generated_tokens"], s["answers"]) for s in r["rounds_stats"]])
            for r in read_results(path)}


def _single(tmp_path, cfg):
    (tmp_path / "single").mkdir()
    one = dataclasses.replace(cfg, out_path=str(tmp_path / "single" / "out.jsonl"), resume=False)
    PaCoReRunner(FakeLLM(_script), one).run()
    return one.out_path


def _kill_after_first_record(kill):
    """An on_reply hook: kill the replica whose answer carried the run's first record, once."""
    killed = []

    def hook(replicas, rank, reply):
        if not killed and any(name == "record" for name, _ in reply.events):
            killed.append(rank)
            kill(replicas, rank)
    return hook, killed


def test_replicas_write_every_problem_once_and_one_summary(tmp_path):
    cfg = _cfg(tmp_path)
    t0 = time.time()
    summary = run_data_parallel(cfg, 2, fake_llm)
    elapsed = time.time() - t0
    recs = read_results(cfg.out_path)
    assert sorted(r["request_id"] for r in recs) == [f"p{i}" for i in range(6)]
    assert all("error" not in r for r in recs)
    run = summary["run"]
    assert sum(run["dispatch"]["problems_per_replica"]) == 6 and not run["dispatch"]["lost"]
    # a replica still loading when all was done has no session; the run's time is the replicas' working
    # span (from the first one ready), without interpreter start-up or model loading
    sessions = run.get("replicas", [run])
    assert run["wall_time_s"] < elapsed
    assert run["generated_tokens"] == sum(r["effective_compute_tokens"] for r in recs)
    assert run["engine_stats"]["prefill_tokens"] == sum(s["engine_stats"]["prefill_tokens"] for s in sessions)
    assert json.loads(open(summary_path(cfg.out_path)).read())["completed"] == 6
    # the same problems on one engine give the same records
    assert _finals(_single(tmp_path, cfg)) == _finals(cfg.out_path)


def test_a_killed_replica_hands_its_problems_to_the_other(tmp_path):
    cfg = _cfg(tmp_path, n=8, rounds=(3, 2), max_problems_in_flight=1, checkpoint_every_s=1e-6)
    kill, killed = _kill_after_first_record(lambda replicas, rank: os.kill(replicas.processes[rank].pid, signal.SIGKILL))

    def hook(replicas, rank, reply):
        fd = os.open(lock_path(cfg.out_path), os.O_RDWR)  # the driver holds the run lock while it writes
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        kill(replicas, rank, reply)
    summary = run_data_parallel(cfg, 2, fake_llm, on_reply=hook)
    assert _successes(cfg.out_path) == [f"p{i}" for i in range(8)]  # every problem exactly once
    dispatch = summary["run"]["dispatch"]
    assert dispatch["lost"] == {str(killed[0]): "killed by signal SIGKILL"}
    assert dispatch["problems_reassigned"] >= 1 and dispatch["duplicate_records_dropped"] == 0
    assert _comparable(cfg.out_path) == _comparable(_single(tmp_path, cfg))
    assert not os.path.lexists(snapshot_dir(cfg.out_path))  # every snapshot was dropped with its finished round


def test_a_replica_that_exits_is_reported(tmp_path):
    cfg = _cfg(tmp_path, max_problems_in_flight=1)
    with pytest.raises(ReplicaError, match="replica [01]: exited with code 7 before reporting"):
        run_data_parallel(cfg, 2, dying_llm)
    assert "p3" not in _successes(cfg.out_path)


def test_ctrl_c_saves_what_the_replicas_hold_and_resume_completes(tmp_path, capsys):
    cfg = _cfg(tmp_path, n=8, max_problems_in_flight=2)

    def interrupt(replicas, rank, reply):
        if any(name == "record" for name, _ in reply.events):
            raise KeyboardInterrupt  # what the driver's SIGINT handler does on Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        run_data_parallel(cfg, 2, fake_llm, on_reply=interrupt)
    assert "Run again with --resume" in capsys.readouterr().err
    assert not multiprocessing.active_children()  # every replica stopped
    assert json.load(open(summary_path(cfg.out_path)))["completed"] >= 1  # the summary of what is done
    cfg.resume = True
    run_data_parallel(cfg, 2, fake_llm)
    assert _successes(cfg.out_path) == [f"p{i}" for i in range(8)]
    assert _comparable(cfg.out_path) == _comparable(_single(tmp_path, cfg))


def test_every_replica_lost_exits_1(tmp_path, monkeypatch, capsys):
    import pacore.replicas.processes

    def lost(cfg, replicas, build_llm, pending=None):
        raise ReplicaError("all 2 replicas were lost with 1 problems left")
    monkeypatch.setattr(pacore.replicas.processes, "run_data_parallel", lost)
    _problems(tmp_path / "in.jsonl", 1)
    assert main(["run", "--data", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl"),
                 "--data-parallel", "2"]) == 1
    assert "all 2 replicas were lost" in capsys.readouterr().err


def test_each_replica_gets_its_own_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert replica_devices(2) == ["3", "5"]
    assert replica_devices(2, tensor_parallel=2) == ["3,5", "6,7"]  # replica r: GPUs [r*T, (r+1)*T)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert replica_devices(1) == ["0"]
    assert replica_devices(1, tensor_parallel=4) == ["0,1,2,3"]
    with pytest.raises(ValueError, match="--data-parallel 5 needs 5 GPUs but 4 are visible"):
        replica_devices(5)
    with pytest.raises(ValueError, match="--data-parallel 4 --tensor-parallel 2 needs 8 GPUs but 4 are visible"):
        replica_devices(4, tensor_parallel=2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert replica_devices(2, tensor_parallel=2) == [None, None]


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
    assert sum(summary["run"]["dispatch"]["problems_per_replica"]) == 3
    assert summary["run"]["engine_stats"]["prefill_tokens"] > 0
    assert "on 2 replicas (problems handed to each: " in capsys.readouterr().out




def test_tensor_parallel_reaches_the_engine(tmp_path, monkeypatch, capsys):
    import engine

    seen = {}

    def fake(**kw):
        seen.update(kw)
        raise SystemExit(3)  # the options are all this test needs
    monkeypatch.setattr(engine, "LLM", fake)
    _problems(tmp_path / "in.jsonl", 1)
    with pytest.raises(SystemExit):
        # 3: SmolLM2's 9 heads split by 3 (2 is refused before the engine is built)
        main(["run", "--data", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl"), "--tensor-parallel", "3"])
    assert seen["tensor_parallel_size"] == 3
