"""Nothing lost: resume never skips a problem that has no result, one run per results file, input
that is not clean UTF-8 JSONL costs only its own lines, and bad flags stop before the model loads."""
import json
import os
import signal
import subprocess
import sys

import pytest

from pacore.cli import build_parser, main
from pacore.config import RunConfig
from pacore.results.files import read_results
from pacore.results.problems import BadLine, Problem, read_problems
from pacore.results.lock import ResultsLocked, lock_path, results_lock
from pacore.replicas.processes import run_data_parallel
from pacore.runner import PaCoReRunner
from pacore.evaluate.summary import summarize
from pacore_fakes import FakeLLM
from test_pacore_runner import default_script


def _problem(pid, text="what is 1+1?", **kw):
    rec = {"messages": [{"role": "user", "content": text}], "ground_truth": {"answer": "2"}, **kw}
    if pid is not None:
        rec["id"] = pid
    return rec


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _cfg(tmp_path, data, **kw):
    return RunConfig(data_path=str(data), out_path=str(tmp_path / "out.jsonl"), rounds=(2,), max_tokens=64,
                     show_progress=False, **kw)


def _final_ids(path):
    return sorted(r["request_id"] for r in read_results(path) if "error" not in r)


# -- 1. resume runs every problem that has no success record -------------------------------------
def test_resume_runs_again_the_problems_that_only_failed(tmp_path, capsys):
    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(3)])
    cfg = _cfg(tmp_path, data, temperature=-1.0)  # the API path: every problem fails in SamplingParams
    summary = PaCoReRunner(FakeLLM(default_script), cfg).run()
    assert summary["errors"] == 3 and summary["completed"] == 0
    cfg.temperature, cfg.resume = 1.0, True
    cfg.override_settings = True  # another temperature than the one recorded
    capsys.readouterr()
    llm = FakeLLM(default_script)
    summary = PaCoReRunner(llm, cfg).run()
    assert "resuming: 0 problems done, 3 problems failed earlier will run again" in capsys.readouterr().err
    assert sorted({rid.split("#")[0] for rid, _, _ in llm.calls}) == ["p0", "p1", "p2"]
    assert _final_ids(cfg.out_path) == ["p0", "p1", "p2"]
    assert len(read_results(cfg.out_path)) == 6  # the error records stay, as history
    # ... and the summary counts each problem once, by its success
    assert (summary["problems"], summary["completed"], summary["errors"]) == (3, 3, 0)


def test_skip_failed_leaves_them(tmp_path, capsys):
    data = _jsonl(tmp_path / "in.jsonl", [_problem(f"p{i}") for i in range(2)])
    cfg = _cfg(tmp_path, data, temperature=-1.0, max_problems_in_flight=1)
    PaCoReRunner(FakeLLM(default_script), cfg).run()
    cfg.temperature, cfg.resume, cfg.skip_failed = 1.0, True, True
    cfg.override_settings = True  # another temperature than the one recorded
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert llm.calls == []
    assert "2 problems failed earlier skipped (--skip-failed)" in capsys.readouterr().err


def test_a_duplicate_id_never_shadows_the_valid_problem(tmp_path):
    # The duplicate's error record is written at once; the run dies before the real p0 finishes.
    data = _jsonl(tmp_path / "in.jsonl", [_problem("p0"), _problem("p0", "again")])
    cfg = _cfg(tmp_path, data)
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(FakeLLM(default_script, interrupt_at_step=3), cfg).run()
    (dup,) = read_results(cfg.out_path)
    assert dup["request_id"] == "p0" and "duplicate id" in dup["error"] and dup["line"] == 2
    cfg.resume = True
    llm = FakeLLM(default_script)
    summary = PaCoReRunner(llm, cfg).run()
    assert llm.calls and _final_ids(cfg.out_path) == ["p0"]
    assert (summary["problems"], summary["completed"], summary["errors"]) == (2, 1, 1)  # p0 and line 2
    # a third session has nothing left: the same bad line is not recorded again
    llm = FakeLLM(default_script)
    PaCoReRunner(llm, cfg).run()
    assert llm.calls == [] and len(read_results(cfg.out_path)) == 2


def test_the_summary_counts_each_problem_once():
    ok = {"rounds_stats": [], "correct": True}
    records = [
        {"request_id": "a", **ok}, {"request_id": "a", **ok},                 # two runs on one file
        {"request_id": "b", "error": "x"}, {"request_id": "b", **ok},         # failed, then retried
        {"request_id": "c", **ok}, {"request_id": "c", "error": "late"},      # a success is never undone
        {"request_id": "d", "error": "x"}, {"request_id": "d", "error": "y"},  # failed twice: the latest
        {"request_id": "a", "error": "duplicate id 'a'", "line": 9, "input_error": True},  # a line, not 'a'
    ]
    s = summarize(records, [2, 1])
    assert (s["problems"], s["completed"], s["errors"], s["graded"]) == (5, 3, 2, 3)
    assert [e["error"] for e in s["error_samples"]] == ["y", "duplicate id 'a'"]


# -- 2. one run per results file ------------------------------------------------------------------
_HOLDER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("lock", {lock_py!r})
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)
with lock.results_lock({out!r}):
    print("locked", flush=True)
    if sys.argv[1] == "die":
        os.kill(os.getpid(), 9)
    sys.stdin.read()
"""


def _holder(out, mode):
    """Another process holding the lock of ``out`` (the lock module alone, so no torch import)."""
    import pacore.results.lock

    code = _HOLDER.format(lock_py=pacore.results.lock.__file__, out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_a_second_run_on_the_same_results_is_refused(tmp_path, capsys):
    data = _jsonl(tmp_path / "in.jsonl", [_problem("p0")])
    out = tmp_path / "out.jsonl"
    holder = _holder(out, "wait")
    try:
        for extra in ([], ["--resume"]):
            assert main(["run", "--data", str(data), "--out", str(out), "--no-progress", *extra]) == 2
            err = capsys.readouterr().err
            assert f"is in use by another pacore run (pid {holder.pid})" in err and "another --out" in err
        with pytest.raises(ResultsLocked):
            run_data_parallel(_cfg(tmp_path, data), 2, None)
        assert out.read_bytes() == b""  # the holder's lock is on the (empty) results file; nothing was written
    finally:
        holder.stdin.close()
        holder.wait()
    assert not os.path.exists(lock_path(str(out)))  # released and removed on exit
    with results_lock(str(out)):
        pass


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    holder = _holder(out, "die")
    assert holder.wait() == -signal.SIGKILL
    assert open(lock_path(str(out))).read().strip() == str(holder.pid)  # left behind, kernel lock gone
    with results_lock(str(out)):
        assert open(lock_path(str(out))).read().strip() == str(os.getpid())
        with results_lock(str(out)):  # the same process again (the CLI, then its data-parallel run)
            pass
    assert f"left by pid {holder.pid}, which is no longer running" in capsys.readouterr().err
    assert not os.path.exists(lock_path(str(out)))


def test_out_equal_to_data_is_refused_in_every_mode(tmp_path, capsys):
    data = _jsonl(tmp_path / "in.jsonl", [_problem("p0")])
    before = data.read_bytes()
    os.symlink(data, tmp_path / "link.jsonl")
    for out in (data, tmp_path / "link.jsonl", f"{tmp_path}/./in.jsonl"):
        for extra in ([], ["--resume"]):
            assert main(["run", "--data", str(data), "--out", str(out), *extra]) == 2
            assert "is the input file" in capsys.readouterr().err
    assert data.read_bytes() == before


# -- 5. input that is not clean UTF-8 JSONL, and flags ---------------------------------------------
def test_non_utf8_lines_are_errors_and_a_bom_is_fine(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + json.dumps(_problem("p0")).encode() + b"\n"
                     + b'{"id": "p1", "messages": [{"role": "user", "content": "caf\xe9"}]}\n'
                     + json.dumps(_problem("p2")).encode() + b"\n")
    items = list(read_problems(str(data)))
    assert [type(x) for x in items] == [Problem, BadLine, Problem]
    assert items[0].id == "p0" and "line 2: not UTF-8 text (byte 0xe9" in items[1].error
    cfg = _cfg(tmp_path, data)
    summary = PaCoReRunner(FakeLLM(default_script), cfg).run()
    assert _final_ids(cfg.out_path) == ["p0", "p2"] and summary["errors"] == 1


def test_a_binary_file_gives_error_records_not_a_traceback(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_bytes(bytes(range(256)) * 8)
    items = list(read_problems(str(data)))
    assert items and all(isinstance(x, BadLine) for x in items)
    cfg = _cfg(tmp_path, data)
    summary = PaCoReRunner(FakeLLM(default_script), cfg).run()
    assert summary["completed"] == 0 and summary["errors"] == len(items)


def test_data_naming_a_directory_says_so(tmp_path, capsys):
    assert main(["run", "--data", str(tmp_path), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "-1"], "must be >= 0"),
    (["--temperature", "nan"], "finite"),
    (["--top-p", "0"], "must be in (0, 1]"),
    (["--top-p", "1.5"], "must be in (0, 1]"),
    (["--seed", "-1"], "must be in [0, 2**64)"),
    (["--rounds", "4,,1"], "comma-separated positive integers"),
    (["--rounds", "0"], "must be at least 1; the final K=1 round is always appended"),
    (["--checkpoint-every", "-1"], "must be >= 0 seconds"),
])
def test_bad_flags_stop_before_anything_runs(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "--data", "d.jsonl", "--out", "o.jsonl", *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_skip_failed_needs_resume(tmp_path, capsys):
    data = _jsonl(tmp_path / "in.jsonl", [_problem("p0")])
    assert main(["run", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--skip-failed"]) == 2
    assert "--skip-failed only applies with --resume" in capsys.readouterr().err


# -- input as a JSON array, ids as the reference pipeline gives them --------------------------------
def test_a_json_array_of_problems_is_read_like_jsonl(tmp_path):
    data = tmp_path / "in.json"
    data.write_text("\ufeff" + json.dumps([_problem("p0"), _problem(None), {"id": "x"}, _problem("p0")], indent=2),
                    encoding="utf-8")
    items = list(read_problems(str(data)))
    assert [type(x) for x in items] == [Problem, Problem, BadLine, BadLine]
    assert [x.id for x in items[:2]] == ["p0", "req_1"]  # the reference pipeline's req_{index}
    assert items[2].error.startswith("item 3: missing or empty 'messages'")
    assert items[3].error.startswith("item 4: duplicate id 'p0'")
    cfg = _cfg(tmp_path, data)
    llm = FakeLLM(lambda prompt, params, rid, i: "\\boxed{2}")
    summary = PaCoReRunner(llm, cfg).run()
    assert _final_ids(cfg.out_path) == ["p0", "req_1"] and summary["errors"] == 2


def test_a_broken_json_array_is_one_error(tmp_path):
    data = tmp_path / "in.json"
    data.write_text(json.dumps([_problem("p0")])[:-1], encoding="utf-8")
    (bad,) = read_problems(str(data))
    assert isinstance(bad, BadLine) and "invalid JSON array" in bad.error and "line 1, column" in bad.error


def test_jsonl_default_ids_are_the_line_index(tmp_path):
    data = _jsonl(tmp_path / "in.jsonl", [_problem("a"), _problem(None), _problem(None)])
    assert [x.id for x in read_problems(str(data))] == ["a", "req_1", "req_2"]
