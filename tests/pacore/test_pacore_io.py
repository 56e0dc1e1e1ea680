import json

import pytest

from pacore.results.resume import OutputExistsError, PriorResults, prepare_output
from pacore.results.files import ResultsWriter, read_results
from pacore.results.problems import BadLine, Problem, read_problems


def _write(path, lines):
    path.write_text("".join(l + "\n" for l in lines), encoding="utf-8")


def test_read_problems_reports_malformed_lines(tmp_path):
    p = tmp_path / "in.jsonl"
    good = {"id": "a", "messages": [{"role": "user", "content": "q"}], "ground_truth": {"answer": "1"}, "cat": "x"}
    _write(p, [
        json.dumps(good),
        "{not json",
        json.dumps({"id": "b"}),
        "",
        json.dumps({"id": "c", "messages": [{"role": "system", "content": "s"}]}),
        json.dumps([1, 2]),
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "dup"}]}),
        json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        json.dumps({"messages": [{"role": "user", "content": "no id"}]}),
    ])
    items = list(read_problems(str(p)))
    assert [type(x).__name__ for x in items] == ["Problem"] + ["BadLine"] * 6 + ["Problem"]
    first = items[0]
    assert isinstance(first, Problem) and first.id == "a" and first.line_no == 1
    assert first.extra == {"ground_truth": {"answer": "1"}, "cat": "x"}
    assert first.messages[-1]["content"] == "q"
    errors = {x.line_no: x.error for x in items if isinstance(x, BadLine)}
    assert "line 2: invalid JSON" in errors[2]
    assert "messages" in errors[3] and items[2].id == "b"
    assert "no user message" in errors[5]
    assert "JSON object" in errors[6]
    assert "duplicate id 'a'" in errors[7]
    assert "string" in errors[8]
    assert items[-1].id == "req_8" and items[-1].key == "req_8"  # the reference pipeline's req_{index}


def test_prepare_output_refuses_without_resume(tmp_path):
    out = tmp_path / "sub" / "r.jsonl"
    assert prepare_output(str(out), resume=False) == PriorResults()  # creates the folder
    assert out.parent.is_dir()
    out.write_text('{"request_id": "a"}\n')
    with pytest.raises(OutputExistsError, match="--resume"):
        prepare_output(str(out), resume=False)
    assert prepare_output(str(out), resume=True).done == {"a"}


def test_resume_cuts_torn_last_line(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"request_id": 1}\n{"request_id": "b", "final_resp')
    assert prepare_output(str(out), resume=True).done == {"1"}
    assert out.read_text() == '{"request_id": 1}\n'
    with ResultsWriter(str(out)) as w:
        w.write({"request_id": "b", "x": "é"})
    assert [r["request_id"] for r in read_results(str(out))] == [1, "b"]
    assert "é" in out.read_text(encoding="utf-8")
