"""Hostile input, round three (issue 38, the pacore items; issue 39 items 11-12): every setting that changes
a record is compared on --resume (1) and a settings file that cannot be read refuses it (2); SIGTERM and
SIGHUP stop a run as Ctrl-C does (3); a FIFO as --out is refused at once (4); an output folder deleted
mid-run is said (5); a refused run creates nothing (6); a plain-string ground truth is graded and an
ungraded problem named (11); problems that ended in error make the exit status non-zero (12); a resume
with nothing left loads no model and a resume says what it continues from (issue 39)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from pacore.cli import main
from pacore.results.files import rounds_path, snapshot_dir, summary_path
from pacore.results.settings import FIRST, settings_path
from pacore_fakes import FakeLLM
from test_pacore_runner import _cfg, default_script

HERE = os.path.dirname(os.path.abspath(__file__))


def _fake_engine(monkeypatch, llm=None, **kw):
    import engine

    monkeypatch.setattr(engine, "LLM", lambda **_: llm or FakeLLM(default_script, **kw))


def _no_engine(monkeypatch):
    import engine

    def refuse(**_):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(engine, "LLM", refuse)


def _argv(cfg, *extra):
    return ["run", "--data", cfg.data_path, "--out", cfg.out_path, "--no-progress", "--checkpoint-every", "0",
            *extra]


def _done(tmp_path, monkeypatch, capsys, *extra, n=2):
    cfg = _cfg(tmp_path, n_problems=n)
    _fake_engine(monkeypatch)
    assert main(_argv(cfg, *extra)) == 0
    capsys.readouterr()
    return cfg


# -- 1. every setting that changes a record is compared ----------------------------------------------
@pytest.mark.parametrize("before, after, flag", [
    (("--preset", "low"), ("--preset", "medium"), "--preset/--rounds"),
    (("--rounds", "3"), ("--rounds", "3,2"), "--preset/--rounds"),
    ((), ("--seed", "7"), "--seed"),
    ((), ("--shuffle", "seeded"), "--shuffle"),
    ((), ("--kv-cache-dtype", "fp8_e4m3"), "--kv-cache-dtype"),
    ((), ("--no-grade",), "--no-grade"),
    ((), ("--pool", "8"), "--pool"),
])
def test_a_resume_with_any_setting_that_changes_a_record_is_refused(tmp_path, monkeypatch, capsys, before, after,
                                                                   flag):
    cfg = _done(tmp_path, monkeypatch, capsys, *before)
    recorded = open(settings_path(cfg.out_path)).read()
    _no_engine(monkeypatch)
    assert main(_argv(cfg, "--resume", *after)) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacore:") and f"{flag}:" in err and "--override-settings" in err
    assert open(settings_path(cfg.out_path)).read() == recorded


def test_speculation_and_more_runs_may_change_across_a_resume(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    _fake_engine(monkeypatch)
    spec = '{"method": "ngram", "num_speculative_tokens": 2}'
    assert main(_argv(cfg, "--resume", "--speculative-config", spec, "--runs", "2")) == 0


def test_settings_recorded_before_some_were_are_completed_not_refused(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    path = settings_path(cfg.out_path)
    doc = json.load(open(path))
    old = {k: doc["settings"][k] for k in FIRST}
    json.dump({"settings": old, "changes": []}, open(path, "w"))  # what an earlier version recorded
    _no_engine(monkeypatch)
    assert main(_argv(cfg, "--resume")) == 0
    assert json.load(open(path))["settings"] == doc["settings"]  # completed with this run's


# -- 2. a settings file that cannot be read refuses the resume -------------------------------------
@pytest.mark.parametrize("content", ['{"settings": {}}', "garbage", "[" * 100_000, '{"settings": {"seed": 0}}'])
def test_a_damaged_settings_file_refuses_the_resume(tmp_path, monkeypatch, capsys, content):
    cfg = _done(tmp_path, monkeypatch, capsys)
    path = settings_path(cfg.out_path)
    with open(path, "w") as f:
        f.write(content)
    _no_engine(monkeypatch)
    assert main(_argv(cfg, "--resume", "--temperature", "0.5")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pacore: {path}") and "--override-settings" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert open(path).read() == content  # never replaced
    _fake_engine(monkeypatch)
    assert main(_argv(cfg, "--resume", "--override-settings")) == 0
    assert json.load(open(path))["settings"]["temperature"] == 1.0


# -- 3. SIGTERM and SIGHUP stop a run as Ctrl-C does -------------------------------------------------
CHILD = """
import os, sys, time
sys.path[:0] = [{tests!r}, {here!r}]
import engine
from pacore_fakes import FakeLLM
from test_pacore_runner import default_script

class Slow(FakeLLM):
    def step(self):
        if len(self.step_log) == 5:
            open({ready!r}, "w").close()
        time.sleep(0.01)
        return super().step()

engine.LLM = lambda **_: Slow(lambda *a: default_script(*a) + " pad" * 400)
import pacore.cli.run
pacore.cli.run._model_context = lambda cfg: 100_000  # no transformers to import: the child starts sooner
from pacore.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_to_a_child_snapshots_summarizes_hints_and_exits_143(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=2)
    ready = str(tmp_path / "ready")
    code = CHILD.format(tests=os.path.dirname(HERE), here=HERE, ready=ready)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", code, *_argv(cfg, "--checkpoint-every", "3600")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not os.path.exists(ready) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 143, err
    _stopped_as_ctrl_c(cfg, err, monkeypatch, capsys)


def test_sighup_stops_a_run_as_ctrl_c_does(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=2)

    class HangUp(FakeLLM):
        def step(self):
            if len(self.step_log) == 5:
                os.kill(os.getpid(), signal.SIGHUP)  # the terminal closed
            return super().step()

    _fake_engine(monkeypatch, llm=HangUp(lambda *a: default_script(*a) + " pad" * 400))
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal (under nohup it is ignored)
    try:
        assert main(_argv(cfg, "--checkpoint-every", "3600")) == 129
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # put back as it was
        _stopped_as_ctrl_c(cfg, capsys.readouterr().err, monkeypatch, capsys)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # under nohup: the run goes on
        cfg.out_path = str(tmp_path / "nohup.jsonl")
        _fake_engine(monkeypatch, llm=HangUp(default_script))
        assert main(_argv(cfg)) == 0
    finally:
        signal.signal(signal.SIGHUP, before)


def _stopped_as_ctrl_c(cfg, err, monkeypatch, capsys):
    """What Ctrl-C leaves: the rounds in flight snapshotted, the summary written, the resume hint last;
    then a resume continues from the snapshots."""
    assert "Traceback" not in err and "--resume" in err.strip().splitlines()[-1]
    assert os.listdir(snapshot_dir(cfg.out_path))
    assert json.load(open(summary_path(cfg.out_path)))["completed"] == 0
    _fake_engine(monkeypatch, llm=FakeLLM(lambda *a: default_script(*a) + " pad" * 400))
    assert main(_argv(cfg, "--resume")) == 0
    assert "from their snapshots" in capsys.readouterr().err


# -- 4. a FIFO as --out is refused, never waited on --------------------------------------------------
def test_a_fifo_as_out_is_refused_at_once(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=1)
    os.mkfifo(cfg.out_path)
    _no_engine(monkeypatch)
    codes = []
    t = threading.Thread(target=lambda: codes.append(main(_argv(cfg))), daemon=True)
    t.start()
    t.join(timeout=30)
    if t.is_alive():  # unblock the open so the thread can end
        os.close(os.open(cfg.out_path, os.O_RDONLY | os.O_NONBLOCK))
        pytest.fail("pacore run waited on a FIFO given as --out")
    assert codes == [2] and "not a regular file" in capsys.readouterr().err


def test_a_fifo_planted_as_a_snapshot_is_refused_never_waited_on(tmp_path, capsys):
    from pacore.results.snapshots import SnapshotStore

    store = SnapshotStore(str(tmp_path / "r.jsonl"))
    store.save("p", 1, 2, 0, [1, 2, 3], [([4, 5], None), ([6], "stop")])
    os.unlink(store._path("p", 1))
    os.mkfifo(store._path("p", 1))
    got = []
    t = threading.Thread(target=lambda: got.append(store.read("p", 1)), daemon=True)
    t.start()
    t.join(timeout=30)
    if t.is_alive():
        os.close(os.open(store._path("p", 1), os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("a FIFO planted as a snapshot was waited on")
    assert got == [None] and "not a regular file" in capsys.readouterr().err


# -- 5. the output folder deleted mid-run -----------------------------------------------------------
@pytest.mark.parametrize("every", ["1e-6", "0"])  # noticed at a snapshot, or at the next record
def test_an_output_folder_deleted_mid_run_is_said_at_the_first_failed_write(tmp_path, monkeypatch, capsys, every):
    cfg = _cfg(tmp_path, n_problems=4)
    cfg.out_path = str(tmp_path / "o" / "out.jsonl")

    class Deleting(FakeLLM):
        def step(self):
            if len(self.step_log) == 30:
                shutil.rmtree(tmp_path / "o")
            return super().step()

    _fake_engine(monkeypatch, llm=Deleting(default_script))
    code = main(_argv(cfg, "--max-problems-in-flight", "1", "--checkpoint-every", every))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "was removed" in err.splitlines()[-1] and "free space" not in err
    assert err.count("could not snapshot") <= 1


# -- 6. a refused run creates nothing ---------------------------------------------------------------
def test_a_refused_run_creates_nothing(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=1)
    os.symlink(tmp_path / "victim", summary_path(cfg.out_path))
    _no_engine(monkeypatch)
    assert main(_argv(cfg)) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl.summary.json"]


def test_a_model_that_fails_to_load_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    import engine

    cfg = _cfg(tmp_path, n_problems=1)
    cfg.out_path = str(tmp_path / "new" / "folders" / "out.jsonl")

    def fail(**_):
        raise ValueError("no weights")

    monkeypatch.setattr(engine, "LLM", fail)
    assert main(_argv(cfg)) == 2
    assert main(_argv(cfg, "--model", str(tmp_path / "no-such-model"))) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # neither files nor the folders made for them


# -- 11. a plain-string ground truth is graded; an ungraded problem is named ------------------------
def test_a_bare_string_or_number_ground_truth_is_graded_and_the_ungraded_are_named(tmp_path, monkeypatch, capsys):
    data = tmp_path / "in.jsonl"
    truths = ["0", 2, {"answer": "4"}, None, {"solution": "8"}]
    with open(data, "w") as f:
        for i, gt in enumerate(truths):
            rec = {"id": f"p{i}", "messages": [{"role": "user", "content": f"what is {i}+{i}?"}]}
            if gt is not None:
                rec["ground_truth"] = gt
            f.write(json.dumps(rec) + "\n")
    cfg = _cfg(tmp_path)
    _fake_engine(monkeypatch)
    assert main(_argv(cfg)) == 0
    out, err = capsys.readouterr()
    records = {r["request_id"]: r for r in map(json.loads, open(cfg.out_path))}
    assert [records[f"p{i}"]["correct"] for i in range(5)] == [True, True, True, None, None]
    assert "5/5 problems completed, 0 errors, 3 graded" in out
    for where in (out, err):
        assert "p3 (no ground_truth)" in where and "p4 (ground_truth has no 'answer')" in where
    assert err.count("p3 (no ground_truth)") == 1


# -- 12. problems that ended in error make the exit status non-zero ---------------------------------
def test_problems_that_ended_in_error_exit_1_with_the_count_last(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=3)
    _fake_engine(monkeypatch, max_model_len=40)  # too short for any round prompt: every problem fails
    assert main(_argv(cfg, "--max-tokens", "8")) == 1
    captured = capsys.readouterr()
    last = (captured.out + captured.err).strip().splitlines()[-1]
    assert "3 problems ended in an error" in last
    assert len(open(cfg.out_path).readlines()) == 3 and os.path.exists(summary_path(cfg.out_path))


# -- issue 39, 11-12: a resume with nothing left loads no model; a resume says what it continues ---
def test_a_resume_with_nothing_left_loads_no_model(tmp_path, monkeypatch, capsys):
    import pacore.cli.run

    cfg = _done(tmp_path, monkeypatch, capsys)
    _no_engine(monkeypatch)
    monkeypatch.setattr(pacore.cli.run, "_model_context", lambda cfg: pytest.fail("the model's config was read"))
    assert main(_argv(cfg, "--resume")) == 0
    out, err = capsys.readouterr()
    assert "nothing left to run" in err and "2/2 problems completed" in out


def test_a_resume_says_it_continues_from_snapshots(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=3)
    _fake_engine(monkeypatch, interrupt_at_step=12)
    assert main(_argv(cfg, "--rounds", "3,2")) == 130
    held = len(os.listdir(snapshot_dir(cfg.out_path)))
    assert held and os.path.exists(rounds_path(cfg.out_path))
    capsys.readouterr()
    _fake_engine(monkeypatch)
    assert main(_argv(cfg, "--rounds", "3,2", "--resume")) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "from their snapshots" in x]
    assert lines == [f"pacore: resuming: {held} round{'s' if held > 1 else ''} in flight continue from their "
                     f"snapshots ({snapshot_dir(cfg.out_path)})"]
