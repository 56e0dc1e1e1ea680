"""A resume never mixes problem sets (issue 52, item 1): the settings file records each problem's id and a
hash of its content; a --data whose problems changed or are missing refuses the resume naming the ids (unless
--override-settings), problems added run as new work, and the summary never counts a record whose problem is
not in --data."""
import json

from pacore.cli import main
from pacore.results.files import read_results, summary_path
from pacore.results.settings import settings_path
from test_pacore_hostile_three import _argv, _done, _fake_engine, _no_engine


def _write(path, problems):
    with open(path, "w") as f:
        for p in problems:
            f.write(json.dumps(p) + "\n")


def _read(path):
    return [json.loads(line) for line in open(path)]


def _resume_refused(cfg, monkeypatch, capsys, *extra):
    before = (open(cfg.out_path).read(), open(settings_path(cfg.out_path)).read())
    _no_engine(monkeypatch)
    assert main(_argv(cfg, "--resume", *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacore:") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (open(cfg.out_path).read(), open(settings_path(cfg.out_path)).read()) == before  # nothing touched
    return err


def test_the_settings_file_records_each_problems_id_and_content_hash(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    problems = json.load(open(settings_path(cfg.out_path)))["problems"]
    assert sorted(problems) == ["p0", "p1"] and all(len(h) == 64 for h in problems.values())
    assert problems["p0"] != problems["p1"]


def test_same_ids_with_another_question_refuse_the_resume_naming_the_id(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    problems = _read(cfg.data_path)
    problems[1]["messages"][0]["content"] = "Problem 1: what is 5+5?"
    _write(cfg.data_path, problems)
    err = _resume_refused(cfg, monkeypatch, capsys)
    assert '"p1"' in err and '"p0"' not in err and "other content" in err and "--override-settings" in err


def test_same_ids_with_another_ground_truth_refuse_the_resume(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    problems = _read(cfg.data_path)
    problems[0]["ground_truth"]["answer"] = "99"
    _write(cfg.data_path, problems)
    err = _resume_refused(cfg, monkeypatch, capsys)
    assert 'id "p0"' in err and "ground truth" in err


def test_another_problems_file_refuses_the_resume_naming_the_missing_ids(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    other = tmp_path / "other.jsonl"
    _write(other, [{"id": "q0", "messages": [{"role": "user", "content": "What is 1+1?"}],
                    "ground_truth": {"answer": "2"}}])
    cfg.data_path = str(other)
    err = _resume_refused(cfg, monkeypatch, capsys)
    assert '"p0", "p1"' in err and "not in --data" in err


def test_the_same_problems_in_another_form_resume(tmp_path, monkeypatch, capsys):
    """A JSON array of the same objects, keys in another order: the same problems, nothing left to run."""
    cfg = _done(tmp_path, monkeypatch, capsys)
    problems = [dict(reversed(list(p.items()))) for p in _read(cfg.data_path)]
    with open(cfg.data_path, "w") as f:
        json.dump(problems, f, indent=2)
    _no_engine(monkeypatch)
    assert main(_argv(cfg, "--resume")) == 0
    assert "nothing left to run" in capsys.readouterr().err


def test_problems_added_to_the_file_run_and_the_rest_are_kept(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    problems = _read(cfg.data_path)
    _write(cfg.data_path, [*problems, {"id": "p2", "messages": [{"role": "user", "content": "What is 2+2?"}],
                                      "ground_truth": {"answer": "4"}}])
    _fake_engine(monkeypatch)
    assert main(_argv(cfg, "--resume")) == 0
    assert sorted(r["request_id"] for r in read_results(cfg.out_path)) == ["p0", "p1", "p2"]
    assert sorted(json.load(open(settings_path(cfg.out_path)))["problems"]) == ["p0", "p1", "p2"]


def test_override_goes_on_logs_the_change_and_never_counts_problems_not_in_data(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys, n=3)
    problems = _read(cfg.data_path)
    _write(cfg.data_path, problems[:2])  # p2 dropped
    _no_engine(monkeypatch)
    assert main(_argv(cfg, "--resume", "--override-settings")) == 0
    err = capsys.readouterr().err
    assert '"p2"' in err and "not counted in the summary" in err
    doc = json.load(open(settings_path(cfg.out_path)))
    assert sorted(doc["problems"]) == ["p0", "p1"]
    assert doc["changes"][-1]["problems"] == {"changed": [], "missing": ["p2"]}
    summary = json.load(open(summary_path(cfg.out_path)))
    assert summary["completed"] == 2 and summary["problems"] == 2
    assert summary["left_out"] == {"problems": 1, "ids": ["p2"]}
    assert len(read_results(cfg.out_path)) == 3  # the record stays in the file; it is only not counted


def test_results_from_before_problem_sets_fill_the_set_in_and_leave_out_other_problems(tmp_path, monkeypatch,
                                                                                        capsys):
    cfg = _done(tmp_path, monkeypatch, capsys, n=3)
    path = settings_path(cfg.out_path)
    doc = json.load(open(path))
    json.dump({"settings": doc["settings"], "changes": []}, open(path, "w"))  # what an earlier version wrote
    _write(cfg.data_path, _read(cfg.data_path)[1:])  # p0 not in --data
    _no_engine(monkeypatch)
    assert main(_argv(cfg, "--resume")) == 0
    err = capsys.readouterr().err
    assert 'id "p0"' in err and "not counted in the summary" in err
    assert sorted(json.load(open(path))["problems"]) == ["p1", "p2"]
    summary = json.load(open(summary_path(cfg.out_path)))
    assert summary["completed"] == 2 and summary["left_out"]["ids"] == ["p0"]


def test_a_settings_file_whose_problem_set_is_damaged_refuses_the_resume(tmp_path, monkeypatch, capsys):
    cfg = _done(tmp_path, monkeypatch, capsys)
    path = settings_path(cfg.out_path)
    doc = json.load(open(path))
    json.dump({**doc, "problems": ["p0", "p1"]}, open(path, "w"))
    err = _resume_refused(cfg, monkeypatch, capsys)
    assert err.startswith(f"pacore: {path} cannot be read") and "--override-settings" in err
