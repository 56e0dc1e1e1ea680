import json

import pytest

from pacore.cli import main
from pacore.cli.demo import demo_records, write_demo_jsonl
from pacore.evaluate.grading import grade, ground_truth_answer
from pacore.results.problems import Problem, read_problems


def test_demo_problems_are_valid_and_gradable(tmp_path):
    path = tmp_path / "demo.jsonl"
    write_demo_jsonl(str(path))
    items = list(read_problems(str(path)))
    assert 4 <= len(items) <= 6 and all(isinstance(p, Problem) for p in items)
    for rec in demo_records():
        gold = ground_truth_answer(rec)
        assert grade(f"So the answer is {gold}.", gold) == (gold, True)


@pytest.mark.slow
def test_demo_end_to_end_on_the_default_model(tmp_path, capsys):
    pytest.importorskip("engine")
    from engine.default_model import resolve_model

    try:
        resolve_model(None)
    except Exception as e:  # the embedded model package is not installed here
        pytest.skip(f"default model unavailable: {e}")
    out = tmp_path / "demo.jsonl"
    assert main(["demo", "--out", str(out), "--max-tokens", "4", "--no-progress"]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == len(demo_records()) and all("error" not in r for r in recs)
    assert all(len(r["round_responses"]) == 2 and len(r["round_responses"][0]) == 4 for r in recs)
    printed = capsys.readouterr()
    assert "accuracy (final answer)" in printed.out
    # issue 28: the start-up line is shown, first on stderr, and only once
    line = printed.err.splitlines()[0]
    assert line.startswith("engine: smollm2-135m-instruct (LlamaForCausalLM), float32, weights float32 538.1 MB, "
                           "KV cache float32: ")
    assert "bytes per token, context 8,192 tokens, device cpu" in line and printed.err.count("engine: ") == 1


def test_run_prints_one_startup_line(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"id": "p", "messages": [{"role": "user", "content": "2 + 2?"}]}) + "\n")
    model = tiny_model_dir("qwen3")
    assert main(["run", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "o.jsonl"),
                 "--rounds", "2", "--max-tokens", "4", "--num-kv-blocks", "64", "--no-progress", "--no-grade"]) == 0
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("engine: ")]
    assert line == (f"engine: {model.name} (Qwen3ForCausalLM), float32, weights float32 0.5 MB, KV cache float32: "
                    f"1,024 tokens (64 blocks "
                    f"of 16), 1,024 bytes per token, context 1,024 tokens, device cpu")


def test_a_demo_rerun_draws_the_same_tokens_and_counts(tmp_path, capsys):
    """README: only the demo's rates and times vary from run to run; its answers, accuracies and every token
    and cache count do not (seeded, counter-based sampling; batches follow the requests, not the clock)."""
    from engine.default_model import resolve_model

    try:
        resolve_model(None)
    except Exception as e:  # the embedded model package is not installed here
        pytest.skip(f"default model unavailable: {e}")
    timed = {"prefill_time_s", "decode_time_s", "tokens_per_s", "started_at", "finished_at"}

    def run(name):
        out = tmp_path / name
        assert main(["demo", "--out", str(out), "--max-tokens", "6", "--no-progress"]) == 0
        recs = [json.loads(line) for line in out.read_text().splitlines()]
        for r in recs:
            r["rounds_stats"] = [{k: v for k, v in s.items() if k not in timed} for s in r["rounds_stats"]]
        return sorted(recs, key=lambda r: str(r["request_id"]))

    first, second = run("a.jsonl"), run("b.jsonl")
    capsys.readouterr()
    assert [r["round_responses"] for r in first] == [r["round_responses"] for r in second]
    assert [r["rounds_stats"] for r in first] == [r["rounds_stats"] for r in second]
    assert [(r.get("final_response"), r.get("correct")) for r in first] == \
        [(r.get("final_response"), r.get("correct")) for r in second]
