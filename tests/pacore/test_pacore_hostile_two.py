"""Hostile input, round two (issue 31, the pacore items): no file beside the results is written through
a link (1), every JSON is strict and a snapshot's logprobs are checked (6), a resume that mixes
--record-confidence says so (7), a full disk is a sentence with nothing half-written left behind (11),
and a finished run leaves no empty snapshot folder (12)."""
import errno
import glob
import json
import os

import pytest
import torch

from pacore.cli import main
from pacore.evaluate.confidence import Confidence
from pacore.evaluate.summary import format_summary
from pacore.results.files import ResultsWriter, WriteFailed, rounds_path, snapshot_dir, summary_path, write_json
from pacore.results.lock import OutputUnusable, lock_path
from pacore.results.settings import settings_path
from pacore.results.snapshots import SnapshotStore
from pacore.runner import PaCoReRunner
from pacore_fakes import FakeLLM, fake_logprobs
from test_pacore_runner import _cfg, default_script

PRECIOUS = "line one\nno newline at the end"


def _strict(text: str) -> list:
    """Every line parsed as strict JSON (NaN and Infinity refused, as outside Python)."""
    def refuse(name):
        raise ValueError(f"bare {name}")
    return [json.loads(line, parse_constant=refuse) for line in text.splitlines() if line.strip()]


def _fake_engine(monkeypatch, **kw):
    import engine

    monkeypatch.setattr(engine, "LLM", lambda **_: FakeLLM(default_script, **kw))


def _argv(cfg, *extra):
    return ["run", "--data", cfg.data_path, "--out", cfg.out_path, "--rounds", "3,2", "--no-progress",
            "--checkpoint-every", "0", *extra]


def _killed(tmp_path, monkeypatch, *extra):
    """A run killed mid-way by the CLI: round checkpoints, snapshots, settings, no summary yet."""
    cfg = _cfg(tmp_path, n_problems=3)
    _fake_engine(monkeypatch, interrupt_at_step=40)
    assert main(_argv(cfg, *extra)) == 130
    assert os.path.getsize(rounds_path(cfg.out_path)) > 0 and os.listdir(snapshot_dir(cfg.out_path))
    _fake_engine(monkeypatch)
    return cfg


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text(PRECIOUS)
    return victim


# -- 1. links beside the results are never written through -------------------------------------------
def test_links_at_the_temporary_names_are_never_followed(tmp_path, monkeypatch):
    cfg = _killed(tmp_path, monkeypatch)
    victim = _victim(tmp_path)
    snapshots = os.listdir(snapshot_dir(cfg.out_path))
    planted = [summary_path(cfg.out_path) + ".tmp", settings_path(cfg.out_path) + ".tmp"]
    planted += [os.path.join(snapshot_dir(cfg.out_path), name + ".tmp") for name in snapshots]
    for link in planted:
        os.symlink(victim, link)
    assert main(_argv(cfg, "--resume")) == 0
    assert victim.read_text() == PRECIOUS
    assert all(os.readlink(link) == str(victim) for link in planted)  # left alone: never opened, never removed
    for path in (summary_path(cfg.out_path), settings_path(cfg.out_path)):
        assert not os.path.islink(path) and json.load(open(path))


@pytest.mark.parametrize("side", ["rounds", "summary", "settings", "partial"])
def test_a_link_at_a_side_file_is_refused_before_any_work(tmp_path, monkeypatch, capsys, side):
    cfg = _killed(tmp_path, monkeypatch)
    path = {"rounds": rounds_path, "summary": summary_path, "settings": settings_path,
            "partial": snapshot_dir}[side](cfg.out_path)
    if side == "partial":
        victim = tmp_path / "elsewhere"
        os.rename(path, victim)
        before = sorted(os.listdir(victim))
    else:
        victim = _victim(tmp_path)
        if os.path.exists(path):
            os.remove(path)
    os.symlink(victim, path)
    results = open(cfg.out_path).read()
    capsys.readouterr()
    assert main(_argv(cfg, "--resume")) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacore:") and path in err and "symbolic link" in err and "Traceback" not in err
    assert os.path.islink(path) and open(cfg.out_path).read() == results
    if side == "partial":
        assert sorted(os.listdir(victim)) == before
    else:
        assert victim.read_text() == PRECIOUS


def test_every_writer_refuses_a_link_planted_during_a_run(tmp_path, capsys):
    victim = _victim(tmp_path)
    out = str(tmp_path / "out.jsonl")
    # an append-only side file: refused, the target untouched
    os.symlink(victim, rounds_path(out))
    with pytest.raises(OutputUnusable, match="symbolic link"):
        ResultsWriter(rounds_path(out))
    # a JSON document: the link is replaced, its target untouched
    os.symlink(victim, summary_path(out))
    write_json(summary_path(out), {"a": 1})
    assert not os.path.islink(summary_path(out)) and json.load(open(summary_path(out))) == {"a": 1}
    # the snapshot folder: never written through; a snapshot file that is a link: never read
    store = SnapshotStore(out)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", store.dir)
    with pytest.raises(WriteFailed, match="symbolic link"):
        store.save("p", 1, 2, 0, [1, 2], [([4], None), ([5], None)])
    assert os.listdir(tmp_path / "elsewhere") == []
    torch.save({"planted": 1}, tmp_path / "elsewhere" / os.path.basename(store._path("p", 1)))
    assert store.read("p", 1) is None and "symbolic link" in capsys.readouterr().err  # not read through it
    store.drop("p", 1)
    assert os.listdir(tmp_path / "elsewhere") == [os.path.basename(store._path("p", 1))]  # nor deleted
    os.remove(store.dir)
    store.save("p", 1, 2, 0, [1, 2], [([4], None), ([5], None)])
    os.rename(store._path("p", 1), tmp_path / "real.pt")
    os.symlink(tmp_path / "real.pt", store._path("p", 1))
    assert store.read("p", 1) is None and "symbolic link" in capsys.readouterr().err
    store.save("p", 1, 2, 0, [1, 2], [([6], None), ([7], None)])  # replaces the link, not its target
    assert not os.path.islink(store._path("p", 1)) and store.read("p", 1)["tokens"][0].tolist() == [6]
    assert torch.load(tmp_path / "real.pt", weights_only=True)["tokens"][0].tolist() == [4]
    assert victim.read_text() == PRECIOUS


# -- 6. strict JSON; a snapshot's logprobs are checked ----------------------------------------------
def test_a_measure_that_is_not_finite_is_null_with_a_reason(tmp_path, monkeypatch):
    import pacore.runner

    monkeypatch.setattr(pacore.runner, "trajectory_confidence", lambda lp: Confidence(float("nan"), float("-inf")))
    cfg = _cfg(tmp_path, rounds=(3, 2), n_problems=2, record_confidence=True)
    PaCoReRunner(FakeLLM(default_script), cfg).run()
    for path in (cfg.out_path, rounds_path(cfg.out_path)):
        assert _strict(open(path).read())
    assert _strict(open(summary_path(cfg.out_path)).read().replace("\n", " "))
    rec = _strict(open(cfg.out_path).read())[0]
    first = rec["round_responses"][0][0]
    assert first["mean_logprob"] is None and first["lowest_group_confidence"] is None
    assert rec["not_finite"]["round_responses[0][0].mean_logprob"] == "nan"
    assert rec["not_finite"]["round_responses[0][0].lowest_group_confidence"] == "-inf"
    assert _strict(open(rounds_path(cfg.out_path)).read())[0]["not_finite"]["responses[0].mean_logprob"] == "nan"


@pytest.mark.parametrize("bad", ["nan sampled", "positive sampled", "nan top", "positive top"])
def test_a_snapshot_whose_logprobs_are_no_log_probabilities_is_not_resumed_with_them(tmp_path, capsys, bad):
    store = SnapshotStore(str(tmp_path / "r.jsonl"))
    lps = [fake_logprobs("ab", 3), fake_logprobs("c", 3)]
    store.save("p", 1, 2, 0, [1, 2], [([97, 98], None), ([99], None)], lps)
    assert store.read("p", 1)["logprobs"][0].token_ids == [97, 98]
    saved = torch.load(store._path("p", 1), weights_only=True)
    which, value = bad.split()[1], float("nan") if bad.startswith("nan") else 0.5
    saved["logprobs"][1]["logprobs" if which == "sampled" else "top_logprobs"][0] = value
    torch.save(saved, store._path("p", 1))
    capsys.readouterr()
    rec = store.read("p", 1)
    assert "logprobs" not in rec and rec["tokens"][0].tolist() == [97, 98]
    err = capsys.readouterr().err
    assert "cannot be used" in err and ("not finite or above 0" in err or "NaN or above 0" in err)


def test_top_logprobs_of_minus_inf_are_log_probabilities(tmp_path):
    store = SnapshotStore(str(tmp_path / "r.jsonl"))
    store.save("p", 1, 1, 0, [1], [([97], None)], [fake_logprobs("a", 3)])
    saved = torch.load(store._path("p", 1), weights_only=True)
    saved["logprobs"][0]["top_logprobs"][2] = float("-inf")  # a token the sampler filtered out
    torch.save(saved, store._path("p", 1))
    assert store.read("p", 1)["logprobs"][0] is not None


# -- 7. --record-confidence mixed across a resume ---------------------------------------------------
def test_a_resume_without_record_confidence_warns_and_the_table_states_its_coverage(tmp_path, monkeypatch, capsys):
    cfg = _killed(tmp_path, monkeypatch, "--record-confidence")
    capsys.readouterr()
    assert main(_argv(cfg, "--resume")) == 0
    captured = capsys.readouterr()
    assert "recorded with --record-confidence, but this session runs without it" in captured.err
    summary = json.load(open(summary_path(cfg.out_path)))
    coverage = [(r["confidence"]["measured"], r["confidence"]["trajectories"]) for r in summary["rounds"]]
    assert coverage[0] == (9, 9)  # round 1 of every problem was checkpointed before the kill
    assert [total for _, total in coverage] == [9, 6, 3] and coverage[1][0] < 6 and coverage[2][0] < 3
    text = format_summary(summary)
    assert f"{coverage[1][0]} of 6" in text and f"{coverage[2][0]} of 3" in text
    assert "only some trajectories have the measures" in text and "without --record-confidence" in text
    # and the other way round: resumed with the flag, after a session without it
    (tmp_path / "b").mkdir()
    cfg = _killed(tmp_path / "b", monkeypatch)
    capsys.readouterr()
    assert main(_argv(cfg, "--resume", "--record-confidence")) == 0
    assert "recorded without --record-confidence" in capsys.readouterr().err


def test_a_whole_run_with_record_confidence_covers_every_trajectory(tmp_path):
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=2, record_confidence=True)
    summary = PaCoReRunner(FakeLLM(default_script), cfg).run()
    c = summary["rounds"][0]["confidence"]
    assert (c["measured"], c["trajectories"]) == (6, 6)
    assert "only some trajectories" not in format_summary(summary)


# -- 11. a full disk -----------------------------------------------------------------------------------
def _full_disk(monkeypatch, under, after_bytes=0, exact=False):
    """os.write into files under ``under`` (``exact``: into that file) fails with ENOSPC once
    ``after_bytes`` were written there (a short write first, as a filling disk does)."""
    real, written = os.write, [0]

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target != str(under) if exact else not target.startswith(str(under)):
            return real(fd, data)
        room = after_bytes - written[0]
        if room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, bytes(data)[:room])
        written[0] += n
        return n

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_at_a_results_write_is_a_sentence_and_no_half_line(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=3)
    _fake_engine(monkeypatch)
    size = [0]

    def record_then_fill(self, record):  # the disk fills in the middle of the second record
        if size[0]:
            _full_disk(monkeypatch, tmp_path / "out.jsonl", after_bytes=100, exact=True)
        write(self, record)
        size[0] = os.path.getsize(cfg.out_path)

    write = ResultsWriter.write
    monkeypatch.setattr(ResultsWriter, "write", record_then_fill)
    assert main(["run", "--data", cfg.data_path, "--out", cfg.out_path, "--rounds", "2", "--no-progress",
                 "--max-problems-in-flight", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next(x for x in err.splitlines() if "No space left on device" in x)
    assert line.startswith(f"pacore: cannot write {cfg.out_path}: No space left on device") and "--resume" in line
    monkeypatch.undo()
    assert len(_strict(open(cfg.out_path).read())) == 1 and os.path.getsize(cfg.out_path) == size[0]
    assert not os.path.exists(lock_path(cfg.out_path))


def test_a_full_disk_at_start_up_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=1)
    _fake_engine(monkeypatch)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    assert main(_argv(cfg)) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacore: cannot write the lock file") and "No space left on device" in err
    assert "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # no .lock, no empty results file


def test_a_full_disk_at_the_settings_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, n_problems=1)
    _fake_engine(monkeypatch)
    _full_disk(monkeypatch, tmp_path / "out.jsonl.settings.json")
    assert main(_argv(cfg)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pacore: cannot write {settings_path(cfg.out_path)}: No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_a_full_disk_at_a_snapshot_is_one_sentence_and_leaves_no_file(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=2, checkpoint_every_s=1e-6)
    _full_disk(monkeypatch, snapshot_dir(cfg.out_path))
    summary = PaCoReRunner(FakeLLM(default_script), cfg).run()
    assert summary["completed"] == 2
    err = capsys.readouterr().err
    assert "could not snapshot the rounds in flight: cannot write" in err and "No space left on device" in err
    assert "Pytorch" not in err and "enforce fail" not in err and "inline_container" not in err
    assert not glob.glob(os.path.join(snapshot_dir(cfg.out_path), "*"))


# -- 12. a finished run leaves no empty snapshot folder ---------------------------------------------
def test_a_finished_run_removes_its_empty_snapshot_folder(tmp_path):
    cfg = _cfg(tmp_path, rounds=(3,), n_problems=2, checkpoint_every_s=1e-6)
    PaCoReRunner(FakeLLM(default_script), cfg).run()
    assert not os.path.lexists(snapshot_dir(cfg.out_path))
