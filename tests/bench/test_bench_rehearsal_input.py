"""bench.rehearsal refuses what would make its tables nan, negative or zeros (issue 31, item 8): every
flag, device figure and replay entry is checked before it runs, with one line naming it and exit 2."""
import json

import pytest

from bench.rehearsal.__main__ import main

BASE = ["--shape", "tiny", "--preset", "low", "--problems", "2", "--prompt-tokens", "64", "--mean-tokens", "300",
        "--conclusion-tokens", "20", "--quiet"]


def _refused(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    last = err[-1]
    for word in words:
        assert word in last, (word, last)
    return last


@pytest.mark.parametrize("figures, named", [
    ({"hbm_bytes_per_s": float("nan")}, "hbm_bytes_per_s"),
    ({"peak_flops": 0}, "peak_flops"),
    ({"memory_bytes": -1}, "memory_bytes"),
    ({"matmul_eff": "high"}, "matmul_eff"),
    ({"attention_bw_eff": 1.5}, "attention_bw_eff"),
    ({"step_overhead_s": -1e-3}, "step_overhead_s"),
    ({"memory_bytes": 1e30}, "--max-kv-tokens"),
    ({"memory_bytes": 2.1e9}, "less than one context"),  # nothing left after the activation reserve
    ({"copy_bw_GBps": "fast"}, "copy_bw_GBps"),
])
def test_a_device_file_of_bad_figures_is_refused_naming_the_figure(tmp_path, capsys, figures, named):
    device = tmp_path / "device.json"
    device.write_text(json.dumps(figures))  # NaN written as the bare NaN Python's json writes
    _refused(capsys, [*BASE, "--device", str(device), "--out", str(tmp_path / "o")], named)


@pytest.mark.parametrize("text", ["[1, 2]", "not json", ""])
def test_a_device_file_that_is_no_object_is_refused(tmp_path, capsys, text):
    device = tmp_path / "device.json"
    device.write_text(text)
    _refused(capsys, [*BASE, "--device", str(device), "--out", str(tmp_path / "o")], str(device))


@pytest.mark.parametrize("flag, value", [("--conclusion-tokens", "nan"), ("--mean-tokens", "-5"),
                                         ("--mean-tokens", "inf"), ("--problems", "0"), ("--prompt-tokens", "-1"),
                                         ("--kv-tokens", "0"), ("--max-num-seqs", "0")])
def test_a_bad_flag_value_is_refused_naming_the_flag(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        main([*BASE, "--kv-tokens", "20000", flag, value, "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and flag in capsys.readouterr().err


@pytest.mark.parametrize("extra, words", [
    (["--prompt-tokens", "9000"], ["--prompt-tokens", "8192"]),
    (["--mean-tokens", "1e9"], ["--mean-tokens"]),
    (["--kv-tokens", "100"], ["--kv-tokens", "less than one context"]),
    ([], ["--max-kv-tokens=16,777,216"]),  # the tiny shape on an H200's memory: half a billion tokens
    (["--kv-tokens", "20000", "--max-kv-tokens", "10000"], ["--max-kv-tokens=10,000"]),
])
def test_flags_that_cannot_work_together_are_refused(tmp_path, capsys, extra, words):
    _refused(capsys, [*BASE, *extra, "--out", str(tmp_path / "o")], *words)


def _replay(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _record(pid, rounds=((4,), (1,))):
    return {"request_id": pid, "run": 0, "round_responses": [
        [{"content": "x</think>yy", "index": i, "tokens": 30, "finish_reason": "stop"} for i in range(k)]
        for (k,) in rounds]}


@pytest.mark.parametrize("bad, words", [
    ("{torn", ["line 2", "not a JSON record"]),
    ({**_record("p1"), "round_responses": "x"}, ["line 2", "round_responses"]),
    ({**_record("p1"), "run": -1}, ["line 2", "run"]),
    ({"request_id": "p1", "round_responses": [[{"index": 0, "tokens": "many"}]]}, ["line 2", "round 1", "'tokens'"]),
    ({"request_id": "p1", "round_responses": [[{"tokens": 3}]]}, ["line 2", "round 1 trajectory 0", "'index'"]),
    ({"request_id": "p1", "round_responses": [[5]]}, ["line 2", "expected an object"]),
    ({"request_id": ["p1"], "round_responses": []}, ["line 2", "request_id"]),
])
def test_a_malformed_replay_entry_is_refused_naming_it(tmp_path, capsys, bad, words):
    replay = _replay(tmp_path / "r.jsonl", [_record("p0"), bad])
    _refused(capsys, [*BASE, "--kv-tokens", "20000", "--replay", str(replay), "--out", str(tmp_path / "o")],
             "--replay", *words)


def test_a_replay_file_that_lacks_the_problems_is_refused(tmp_path, capsys):
    replay = _replay(tmp_path / "r.jsonl", [_record("p0")])  # --problems 2: one recorded
    _refused(capsys, [*BASE, "--kv-tokens", "20000", "--replay", str(replay), "--out", str(tmp_path / "o")],
             "records 1 of the 2 problems", "p0", "--problems")
    replay = _replay(tmp_path / "r.jsonl", [_record("p0"), _record("p1", rounds=((2,), (1,)))])  # K=2, not 4
    _refused(capsys, [*BASE, "--kv-tokens", "20000", "--replay", str(replay), "--out", str(tmp_path / "o")],
             "problem p1 round 1 index 2")


def test_a_replay_file_that_has_them_runs(tmp_path, capsys):
    replay = _replay(tmp_path / "r.jsonl", [_record("p0"), _record("p1")])
    out = tmp_path / "o"
    assert main([*BASE, "--kv-tokens", "20000", "--replay", str(replay), "--out", str(out)]) == 0
    report = json.loads((out / "engine" / "report.json").read_text())
    assert report["overall"]["tokens"] == 2 * (4 + 1) * 30


def test_a_rehearsal_whose_problems_fail_is_not_a_table(tmp_path, capsys):
    # a prompt that fits the context but leaves round 1 no room for its K answers in the cache
    assert main([*BASE, "--kv-tokens", "20000", "--prompt-tokens", "8150", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "problems failed in the rehearsal of engine" in err and not (tmp_path / "o" / "table.md").exists()
