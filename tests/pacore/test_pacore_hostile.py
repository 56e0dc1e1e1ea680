"""Hostile input, links and bad luck on the results files (issue 22, items 1-7): the lock never follows
a link, one run per file whatever its name, any line that fails to parse is that line's error, side
files of the wrong shape are ignored and redone, resume with other settings is refused, keys are
injective, and bad paths or a full disk give clear messages."""
import errno
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from pacore.cli import build_parser, main
from pacore.cli.run import _config
from pacore.results.preflight import refused_paths
from pacore.results.files import ResultsWriter, read_results, rounds_path, snapshot_dir
from pacore.results.keys import RequestKey, parse_request_id, pool_key, request_id, run_key, unit_key
from pacore.results.lock import OutputUnusable, ResultsLocked, lock_path, results_lock
from pacore.results.problems import BadLine, Problem, read_problems
from pacore.results.snapshots import SnapshotStore
from pacore.runner import PaCoReRunner
from pacore_fakes import FakeLLM
from test_pacore_reliability import _cfg, _final_ids, _holder, _jsonl, _problem
from test_pacore_runner import default_script

V1 = Path(__file__).parent / "data" / "results_v1"  # written by the version before keys were escaped


def _boxed(prompt, params, rid, i):
    return "<think>t</think>\\boxed{2}"


# -- 1. the lock never follows a link, never deletes what it did not create ------------------------
@pytest.mark.parametrize("kind", ["symlink", "hardlink", "foreign"])
def test_the_lock_never_follows_a_link_nor_deletes_a_file_it_did_not_create(tmp_path, kind):
    out = tmp_path / "out.jsonl"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = Path(lock_path(str(out)))
    if kind == "symlink":
        os.symlink(victim, lock)
    elif kind == "hardlink":
        os.link(victim, lock)
    else:  # a regular file that is no lock file of a run
        shutil.copy(victim, lock)
    with pytest.raises(OutputUnusable, match="lock file|symbolic link") as e:
        with results_lock(str(out)):
            pass
    assert str(lock) in str(e.value) and "remove it" in str(e.value)
    assert victim.read_text() == "precious\n" and lock.read_text() == "precious\n"
    assert os.path.lexists(lock) and (kind != "symlink" or os.path.islink(lock))


# -- 2. one run per file, whatever name reaches it -------------------------------------------------
@pytest.mark.parametrize("link", [os.symlink, os.link])
def test_a_second_run_by_another_name_of_the_results_file_is_refused(tmp_path, link):
    data = _jsonl(tmp_path / "in.jsonl", [_problem("p0")])
    out = tmp_path / "out.jsonl"
    out.write_text("")
    other = tmp_path / "other.jsonl"
    link(out, other)
    holder = _holder(out, "wait")
    try:
        cfg = _cfg(tmp_path, data)
        cfg.out_path = str(other)
        with pytest.raises(ResultsLocked, match="in use by another pacore run"):
            PaCoReRunner(FakeLLM(_boxed), cfg).run()
    finally:
        holder.stdin.close()
        holder.wait()
    assert out.read_text() == ""


def test_side_files_belong_to_the_real_file_not_to_its_name(tmp_path):
    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(3)])
    out = tmp_path / "out.jsonl"
    os.symlink(out, tmp_path / "link.jsonl")
    cfg = _cfg(tmp_path, data, checkpoint_every_s=0)
    cfg.rounds, cfg.out_path = (3, 2), str(tmp_path / "link.jsonl")
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(default_script, interrupt_at_step=60), cfg).run()
    assert os.path.getsize(rounds_path(str(out))) > 0 and os.listdir(snapshot_dir(str(out)))
    assert not os.path.lexists(f"{cfg.out_path}.rounds.jsonl") and not os.path.lexists(f"{cfg.out_path}.partial")
    cfg.out_path, cfg.resume = str(out), True  # resumed by the real name: the checkpoints are found
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert llm.resumed and not any(rid.endswith("#r1") for rid, _, _ in llm.calls)
    assert _final_ids(out) == ["p0", "p1", "p2"]


# -- 3. deep or huge JSON is that line's error ---------------------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000
HUGE = '{"id": "h", "messages": [{"role": "user", "content": "q"}], "n": ' + "9" * 5000 + "}"


def test_deep_or_huge_json_costs_its_own_line(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps(_problem("p0")) + "\n" + DEEP + "\n" + HUGE + "\n" + json.dumps(_problem("p1")) + "\n")
    items = list(read_problems(str(data)))
    assert [type(x) for x in items] == [Problem, BadLine, BadLine, Problem]
    assert items[1].error.startswith("line 2: invalid JSON") and items[2].error.startswith("line 3: invalid JSON")
    cfg = _cfg(tmp_path, data)
    summary = PaCoReRunner(FakeLLM(_boxed), cfg).run()
    assert _final_ids(cfg.out_path) == ["p0", "p1"] and summary["errors"] == 2
    # the same lines in the results file and the checkpoints: --resume reads past them
    for path in (cfg.out_path, rounds_path(cfg.out_path)):
        with open(path, "a") as f:
            f.write(DEEP + "\n" + HUGE + "\n")
    cfg.resume = True
    llm = FakeLLM(_boxed)
    summary = PaCoReRunner(llm, cfg).run()
    assert llm.calls == [] and summary["completed"] == 2


@pytest.mark.parametrize("bad", [DEEP, "9" * 5000])
def test_deep_or_huge_json_in_an_array_is_an_error_record(tmp_path, bad):
    data = tmp_path / "in.json"
    data.write_text("[" + json.dumps(_problem("p0")) + ", " + bad + "]")
    (item,) = read_problems(str(data))
    assert isinstance(item, BadLine) and "invalid JSON array" in item.error
    summary = PaCoReRunner(FakeLLM(_boxed), _cfg(tmp_path, data)).run()
    assert summary["errors"] == 1


# -- 4. side files of the wrong shape are ignored with a warning and redone ------------------------
def _rewrite(path, edit):
    recs = [json.loads(line) for line in open(path)]
    with open(path, "w") as f:
        for rec in recs:
            rec = edit(rec)
            if rec is not None:
                f.write(json.dumps(rec) + "\n")


def test_checkpoints_of_the_wrong_shape_are_redone_and_older_ones_read(tmp_path, capsys):
    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(4)])
    cfg = _cfg(tmp_path, data, max_problems_in_flight=4)
    cfg.rounds = (3, 2)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(_boxed, interrupt_at_step=30), cfg).run()

    def edit(rec):
        if rec["round"] != 1:
            return None
        if rec["request_id"] == "p0":  # wrong types, a key missing
            rec["stats"]["prompt_tokens"] = "many"
            del rec["stats"]["k"]
        elif rec["request_id"] == "p1":  # fewer responses than K
            rec["responses"] = rec["responses"][:1]
        elif rec["request_id"] == "p2":  # not even an object where the stats go
            rec["stats"] = [1, 2]
        else:  # an older (or newer) RoundStats: a key it lacks has a default, one it has is unknown
            del rec["stats"]["truncated_tokens"]
            rec["stats"]["from_the_future"] = 1
        return rec

    _rewrite(rounds_path(cfg.out_path), edit)
    cfg.resume = True
    capsys.readouterr()
    llm = FakeLLM(_boxed)
    summary = PaCoReRunner(llm, cfg).run()
    err = capsys.readouterr().err
    assert "3 round checkpoints" in err and "run again" in err
    called = {rid for rid, _, _ in llm.calls}
    assert {rid for rid in called if rid.endswith("#r1")} == {"p0#r1", "p1#r1", "p2#r1"}
    assert "p3#r2" in called  # the older checkpoint was read: round 2 next
    assert summary["completed"] == 4 and summary["errors"] == 0


def test_results_records_of_the_wrong_shape_never_crash_resume_or_the_summary(tmp_path, capsys):
    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(3)])
    cfg = _cfg(tmp_path, data)
    PaCoReRunner(FakeLLM(_boxed), cfg).run()

    def edit(rec):
        if rec["request_id"] == "p0":
            rec["run"] = "x"
        elif rec["request_id"] == "p1":
            rec["rounds_stats"] = [{"prompt_tokens": None}]
        return rec

    _rewrite(cfg.out_path, edit)
    with open(cfg.out_path, "a") as f:
        f.write('[1, 2]\n{"request_id": {"a": 1}}\n{"request_id": "p2", "error": "x", "line": "one", "input_error": true}\n')
    cfg.resume = True
    capsys.readouterr()
    llm = FakeLLM(_boxed)
    summary = PaCoReRunner(llm, cfg).run()
    err = capsys.readouterr().err
    assert "ignored 5 records" in err
    assert sorted(rid for rid, _, _ in llm.calls) == ["p0#r2", "p1#r2"]  # redone, from their round-1 checkpoints
    assert summary["completed"] == 3 and summary["problems"] == 3


def test_a_snapshot_of_the_wrong_shape_is_ignored_with_a_warning(tmp_path, capsys):
    import torch

    store = SnapshotStore(str(tmp_path / "r.jsonl"))
    store.save("p", 1, 2, 0, [1, 2, 3], [([4, 5], None), ([6], "stop")])
    path = store._path("p", 1)
    rec = torch.load(path, weights_only=True)
    torch.save({**rec, "finish_reasons": [None]}, path)  # fewer trajectories than K
    assert store.load("p", 1, 2, 0, [1, 2, 3]) is None
    torch.save([1, 2], path)
    assert store.load("p", 1, 2, 0, [1, 2, 3]) is None
    assert capsys.readouterr().err.count("cannot be used") == 2


# -- 5. resume with other settings is refused, naming each ----------------------------------------
def test_resume_with_other_settings_is_refused_naming_each(tmp_path, capsys):
    from pacore.results.settings import settings_path

    data = _jsonl(tmp_path / "in.jsonl", [_problem("p0")])
    out = str(tmp_path / "out.jsonl")
    argv = ["run", "--data", str(data), "--out", out, "--no-progress"]
    PaCoReRunner(FakeLLM(_boxed), _config(build_parser().parse_args(argv), str(data), out, False)).run()
    assert json.load(open(settings_path(out)))["settings"]["temperature"] == 1.0
    capsys.readouterr()
    assert main([*argv, "--resume", "--temperature", "0.5", "--top-p", "0.9", "--max-tokens", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacore:") and "--override-settings" in err
    for flag in ("--temperature", "--top-p", "--max-tokens"):
        assert flag in err
    assert "--model" not in err and "--dtype" not in err


def test_an_override_runs_and_records_the_change(tmp_path):
    from pacore.results.settings import SettingsChanged, settings_path

    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(2)])
    cfg = _cfg(tmp_path, data, max_problems_in_flight=1)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(_boxed, interrupt_at_step=15), cfg).run()
    cfg.resume, cfg.temperature, cfg.message_token_cap = True, 0.5, 7
    with pytest.raises(SettingsChanged) as e:
        PaCoReRunner(FakeLLM(_boxed), cfg).run()
    assert "--temperature: 1.0 in the results, 0.5 now" in str(e.value) and "--message-token-cap" in str(e.value)
    cfg.override_settings = True
    assert PaCoReRunner(FakeLLM(_boxed), cfg).run()["completed"] == 2
    recorded = json.load(open(settings_path(cfg.out_path)))
    assert recorded["settings"]["temperature"] == 0.5
    (change,) = recorded["changes"]
    assert change["from"] == {"temperature": 1.0, "message_token_cap": "auto"}
    assert change["to"] == {"temperature": 0.5, "message_token_cap": 7}


# -- 6. keys are injective for any id -------------------------------------------------------------
def test_ids_that_look_like_keys_never_collide(tmp_path):
    ids = ["a", "a#run1", "a#pool", "a#run1#r1", "a%23run1", "a\x1frun1", "#", "%", ""]
    data = _jsonl(tmp_path / "in.jsonl", [_problem(i) for i in ids])
    cfg = _cfg(tmp_path, data, runs=2)
    summary = PaCoReRunner(FakeLLM(_boxed), cfg).run()
    assert summary["errors"] == 0 and summary["completed"] == 2 * len(ids)
    units = [unit_key(i, r) for i in ids for r in range(3)] + [pool_key(i) for i in ids]
    assert len(set(units)) == len(units)
    rids = [request_id(u, n) for u in units for n in (1, 2, 11)]
    assert len(set(rids)) == len(rids)
    runs = [run_key(i, r) for i in ids for r in range(3)]
    assert len(set(runs)) == len(runs)
    for i in ids:  # and a request id reads back as what it names
        for unit, run in [(unit_key(i, r), r) for r in range(3)] + [(pool_key(i), "pool")]:
            assert parse_request_id(request_id(unit, 12)) == RequestKey(i, run, 12)
    for bad in ("a", "a#x#r1", "a#run0#r1", "a#run1#x", "a%2#r1"):
        with pytest.raises(ValueError, match="not a PaCoRe request id"):
            parse_request_id(bad)


def test_results_written_by_the_previous_version_still_resume(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(V1, old)
    cfg = _cfg(old, old / "in.jsonl", runs=2, max_problems_in_flight=2)
    # it predates the settings file: nothing to check the resume against, so it is asked for (issue 48)
    cfg.rounds, cfg.resume, cfg.override_settings = (3, 2), True, True
    llm = FakeLLM(_script_v1)
    PaCoReRunner(llm, cfg).run()
    # p0 and p1 were done; p2's two runs continue at round 2 from their snapshots
    assert sorted(rid for rid, _, _ in llm.calls) == ["p2#r2", "p2#r3", "p2#run1#r2", "p2#run1#r3"]
    assert sorted(llm.resumed) == ["p2#r2", "p2#run1#r2"]
    whole = tmp_path / "whole"
    whole.mkdir()
    wcfg = _cfg(whole, old / "in.jsonl", runs=2)
    wcfg.rounds = (3, 2)
    PaCoReRunner(FakeLLM(_script_v1), wcfg).run()
    by_run = lambda path: {(r["request_id"], r["run"]): r["round_responses"] for r in read_results(path)}  # noqa: E731
    assert by_run(cfg.out_path) == by_run(wcfg.out_path)


def _script_v1(prompt, params, rid, i):
    from test_pacore_runs import script  # the script the fixture was written with

    return script(prompt, params, rid, i)


# -- 7. clear errors instead of tracebacks ----------------------------------------------------------
def _unwritable(tmp_path, kind):
    if kind == "parent is a file":
        (tmp_path / "f").write_text("")
        return tmp_path / "f" / "out.jsonl"
    if kind == "lock path is a folder":
        os.mkdir(tmp_path / "out.jsonl.lock")
        return tmp_path / "out.jsonl"
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    return ro / "out.jsonl"


@pytest.mark.parametrize("kind", ["parent is a file", "lock path is a folder", "read-only folder"])
def test_an_unusable_out_exits_2_with_a_message(tmp_path, capsys, kind):
    data = _jsonl(tmp_path / "in.jsonl", [_problem("p0")])
    out = _unwritable(tmp_path, kind)
    assert main(["run", "--data", str(data), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacore:") and "Traceback" not in err and "--out" in err


def test_data_that_is_a_pipe_is_read_and_a_device_refused(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    args = build_parser().parse_args(["run", "--data", str(fifo), "--out", str(tmp_path / "o.jsonl")])
    assert refused_paths(_config(args, args.data, args.out, False)) is None
    writer = threading.Thread(target=lambda: fifo.write_text(json.dumps(_problem("p0")) + "\n"))
    writer.start()
    items = list(read_problems(str(fifo)))
    writer.join()
    assert [x.id for x in items] == ["p0"]
    assert "character device" in refused_paths(_config(args, "/dev/null", args.out, False))


def test_a_lock_naming_a_live_pid_is_not_called_dead(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    Path(lock_path(str(out))).write_text(f"{os.getppid()}\n")  # alive, and not the holder
    with results_lock(str(out)):
        pass
    err = capsys.readouterr().err
    assert str(os.getppid()) in err and "no longer running" not in err and "still running" in err


def test_a_full_disk_at_a_snapshot_warns_and_carries_on(tmp_path, capsys, monkeypatch):
    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(2)])
    cfg = _cfg(tmp_path, data, checkpoint_every_s=1e-6)
    write = SnapshotStore.write
    calls = []

    def full_once(self, record):
        calls.append(record["key"])
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, record)

    monkeypatch.setattr(SnapshotStore, "write", full_once)
    summary = PaCoReRunner(FakeLLM(default_script), cfg).run()
    assert summary["completed"] == 2 and len(calls) > 1
    assert "could not snapshot" in capsys.readouterr().err
    # the results themselves cannot be written: that fails the run
    monkeypatch.setattr(ResultsWriter, "write", lambda self, rec: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    cfg.out_path = str(tmp_path / "other.jsonl")
    with pytest.raises(OSError, match="No space left"):
        PaCoReRunner(FakeLLM(default_script), cfg).run()


def fake_llm(cfg):  # built inside a spawned replica
    return FakeLLM(default_script)


def test_a_full_disk_at_a_replicas_snapshot_warns_and_carries_on(tmp_path, capsys, monkeypatch):
    from pacore.replicas.processes import run_data_parallel

    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(2)])
    cfg = _cfg(tmp_path, data, checkpoint_every_s=1e-6)

    def full(self, record):  # the driver writes the replicas' snapshots
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SnapshotStore, "write", full)
    summary = run_data_parallel(cfg, 1, fake_llm)
    assert summary["completed"] == 2
    assert "could not save a snapshot" in capsys.readouterr().err
