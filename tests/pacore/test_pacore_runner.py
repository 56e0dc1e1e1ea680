import json

import pytest

from pacore.cli import main
from pacore.config import RunConfig
from pacore.results.files import read_results
from pacore.runner import PaCoReRunner, run_pacore
from pacore.results.files import summary_path
from pacore_fakes import FakeLLM


def _problems(path, n, answers=None):
    with open(path, "w") as f:
        for i in range(n):
            rec = {"id": f"p{i}", "messages": [{"role": "user", "content": f"Problem {i}: what is {i}+{i}?"}],
                   "ground_truth": {"answer": str(2 * i if answers is None else answers[i])}, "source": "t"}
            f.write(json.dumps(rec) + "\n")


def _round_of(prompt_text: str) -> int:
    return 1 if "Reference Responses" not in prompt_text else 2


def default_script(prompt, params, rid, i):
    """Round 1: thinking then a boxed answer (child 0 wrong); later rounds: the right answer."""
    pid = int(rid.split("#")[0][1:])
    if "Reference Responses" not in prompt:
        ans = 2 * pid if i else 2 * pid + 1
        return f"<think>think {i}</think>\nSo \\boxed{{{ans}}}"
    return f"<think>compare</think>Final: \\boxed{{{2 * pid}}}"


def _cfg(tmp_path, **kw):
    data = tmp_path / "in.jsonl"
    if not data.exists():
        _problems(data, kw.pop("n_problems", 3))
    kw.pop("n_problems", None)
    return RunConfig(data_path=str(data), out_path=str(tmp_path / "out.jsonl"), show_progress=False, **kw)


def _run(llm, cfg):
    return PaCoReRunner(llm, cfg).run()


def test_each_round_is_one_request_with_n_k(tmp_path):
    llm = FakeLLM(default_script)
    cfg = _cfg(tmp_path, rounds=(4, 2), n_problems=2, max_tokens=64)
    _run(llm, cfg)
    by_problem = {}
    for rid, ids, params in llm.calls:
        by_problem.setdefault(rid.split("#")[0], []).append(params.n)
        assert params.temperature == 1.0 and params.top_p == 1.0 and params.max_tokens == 64
    assert by_problem == {"p0": [4, 2, 1], "p1": [4, 2, 1]}
    # prefill counted once per request, not once per trajectory
    assert llm.stats()["prefill_tokens"] == sum(len(ids) for _, ids, _ in llm.calls)
    seeds = [p.seed for _, _, p in llm.calls]
    assert len(set(seeds)) == len(seeds)


def test_results_records_and_summary(tmp_path):
    llm = FakeLLM(default_script)
    cfg = _cfg(tmp_path, rounds=(4,), n_problems=3)
    summary = _run(llm, cfg)
    recs = read_results(cfg.out_path)
    assert sorted(r["request_id"] for r in recs) == ["p0", "p1", "p2"]
    r = next(x for x in recs if x["request_id"] == "p1")
    # the reference pipeline's keys hold what it records under plain `vllm serve`: the whole text
    assert r["final_response"] == "<think>compare</think>Final: \\boxed{2}"
    assert r["final_reasoning_content"] == ""
    assert len(r["round_responses"]) == 2 and len(r["round_responses"][0]) == 4
    # equal lengths: the official order is random.Random(42)'s permutation of 4, [2, 1, 3, 0]
    assert [t["index"] for t in r["round_responses"][0]] == [2, 1, 3, 0]
    text1 = "<think>think 1</think>\nSo \\boxed{2}"
    assert r["round_responses"][0][1] == {"content": text1, "reasoning_content": "", "index": 1,
                                          "finish_reason": "stop", "tokens": len(text1)}
    assert r["answer"] == "2" and r["correct"] is True
    assert r["source"] == "t" and r["ground_truth"] == {"answer": "2"}
    s1, s2 = r["rounds_stats"]
    assert (s1["k"], s2["k"], s1["round"], s2["round"]) == (4, 1, 1, 2)
    assert s1["accuracy"] == 0.75 and s2["accuracy"] == 1.0
    assert s1["answers"] == ["2", "2", "2", "3"]  # in the recorded order
    assert s1["references"] == 0 and s2["references"] == 4 and s2["dropped_messages"] == 0
    assert s1["generated_tokens"] == sum(len(f"<think>think {i}</think>\nSo \\boxed{{{3 if i == 0 else 2}}}") for i in range(4))
    assert r["effective_compute_tokens"] == s1["generated_tokens"] + s2["generated_tokens"]
    assert s1["kv_blocks_saved_by_sharing"] == (s1["prompt_tokens"] // 16) * 3
    assert s1["finish_reasons"] == {"stop": 4}
    assert r["self_consistency"] == {"k": 4, "answer": "2", "correct": True}
    assert summary["accuracy"] == 1.0 and summary["self_consistency_accuracy"] == 1.0
    assert summary["rounds"][0]["accuracy"] == 0.75
    assert summary["completed"] == 3 and summary["errors"] == 0
    on_disk = json.loads(open(summary_path(cfg.out_path)).read())
    assert on_disk["accuracy"] == 1.0 and on_disk["config"]["schedule"] == [4, 1]
    assert on_disk["run"]["generated_tokens"] == sum(x["effective_compute_tokens"] for x in recs)


def test_round2_prompt_holds_the_official_order_of_exact_references(tmp_path):
    seen = {}
    texts = ["<think>secret0</think>\n\nmsg0 longest one", "<think>s1</think>msg1", "msg2 no think",
             "<think>s3</think>  msg3  ", "<think>s4</think>", "<think>secret5</think>\nmsg5 mid"]

    def script(prompt, params, rid, i):
        seen.setdefault(rid, prompt)
        return texts[i] if rid.endswith("#r1") else "done"

    llm = FakeLLM(script)
    cfg = _cfg(tmp_path, rounds=(6,), n_problems=1, seed=3)
    _run(llm, cfg)
    recorded = read_results(cfg.out_path)[0]["round_responses"][0]
    by_length = sorted(range(6), key=lambda i: len(texts[i]))
    official = [by_length[j] for j in [3, 1, 2, 4, 0, 5]]  # random.Random(42).shuffle of 6 items
    assert [t["index"] for t in recorded] == official
    assert [t["content"] for t in recorded] == [texts[i] for i in official]
    refs = [texts[i].split("</think>")[-1] for i in official]  # unstripped; "" for child 4 is kept
    from pacore.prompts import render_controller_prompt
    assert render_controller_prompt("Problem 0: what is 0+0?", refs) in seen["p0#r2"]
    assert "secret" not in seen["p0#r2"]
    # another seed, the same official order
    tmp2 = tmp_path / "again"
    tmp2.mkdir()
    seen.clear()
    _run(FakeLLM(script), _cfg(tmp2, rounds=(6,), n_problems=1, seed=4))
    assert [t["index"] for t in read_results(str(tmp2 / "out.jsonl"))[0]["round_responses"][0]] == official


def test_seeded_shuffle_depends_on_the_seed(tmp_path):
    def script(prompt, params, rid, i):
        return f"m{i}" if rid.endswith("#r1") else "done"

    orders = []
    for seed in (3, 3, 4):
        d = tmp_path / f"s{len(orders)}"
        d.mkdir()
        cfg = _cfg(d, rounds=(8,), n_problems=1, seed=seed, shuffle="seeded")
        _run(FakeLLM(script), cfg)
        orders.append([t["index"] for t in read_results(cfg.out_path)[0]["round_responses"][0]])
    assert orders[0] == orders[1] and orders[0] != orders[2]
    assert sorted(orders[0]) == list(range(8)) and orders[0] != list(range(8))


def test_only_empty_texts_are_dropped(tmp_path):
    def script(prompt, params, rid, i):
        if rid.endswith("#r1"):
            return ["", "<think>only thoughts</think>", "", "answer 3"][i]
        return "ok"

    llm = FakeLLM(script)
    cfg = _cfg(tmp_path, rounds=(4,), n_problems=1)
    _run(llm, cfg)
    st = read_results(cfg.out_path)[0]["rounds_stats"][1]
    assert st["references"] == 2 and st["dropped_messages"] == 2
    prompt = llm.tokenizer.decode(llm.calls[-1][1])
    assert "Reference 2:" in prompt and "Reference 3:" not in prompt
    assert "Reference 1:\n\n" in prompt or "Reference 2:\n\n" in prompt  # the empty conclusion is kept


def test_all_responses_empty_still_uses_the_template(tmp_path):
    # as the reference pipeline: rounds after the first always render the controller prompt
    llm = FakeLLM(lambda p, sp, rid, i: "" if rid.endswith("#r1") else "y")
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=1)
    _run(llm, cfg)
    prompt = llm.tokenizer.decode(llm.calls[1][1])
    assert "Reference Responses:\n\n\nNow, based on" in prompt and "Reference 1" not in prompt
    assert read_results(cfg.out_path)[0]["rounds_stats"][1]["dropped_messages"] == 2


def test_problems_at_different_rounds_share_steps(tmp_path):
    # p0 answers fast, p1 slowly: p0's round 2 must run while p1 is still in round 1.
    def script(prompt, params, rid, i):
        pid = rid.split("#")[0]
        return ("a" * 3 if pid == "p0" else "b" * 40) if rid.endswith("#r1") else "c" * 5

    llm = FakeLLM(script)
    _run(llm, _cfg(tmp_path, rounds=(3,), n_problems=2))
    overlap = [s for s in llm.step_log if "p0#r2" in s and "p1#r1" in s]
    assert overlap, "no global barrier: rounds of different problems decode in the same steps"
    # p0's round 2 was added right after its round 1 finished (the next step), not after p1
    first_r2 = next(i for i, s in enumerate(llm.step_log) if "p0#r2" in s)
    last_r1 = max(i for i, s in enumerate(llm.step_log) if "p0#r1" in s)
    assert first_r2 == last_r1 + 1


def test_bounded_problems_in_flight(tmp_path):
    llm = FakeLLM(default_script)
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=7, max_problems_in_flight=3)
    _run(llm, cfg)
    assert max(len(s) for s in llm.step_log) <= 3
    assert len(read_results(cfg.out_path)) == 7


def test_resume_after_kill(tmp_path):
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=6, max_problems_in_flight=2)
    killed = FakeLLM(default_script, interrupt_at_step=160)
    with pytest.raises(KeyboardInterrupt):
        _run(killed, cfg)
    first = [r["request_id"] for r in read_results(cfg.out_path)]
    assert 0 < len(first) < 6
    with pytest.raises(Exception, match="--resume"):
        _run(FakeLLM(default_script), cfg)
    cfg.resume = True
    llm = FakeLLM(default_script)
    summary = _run(llm, cfg)
    redone = {rid.split("#")[0] for rid, _, _ in llm.calls}
    assert not redone & set(first)
    ids = [r["request_id"] for r in read_results(cfg.out_path)]
    assert sorted(ids) == [f"p{i}" for i in range(6)]
    assert summary["completed"] == 6


def test_resume_results_identical_to_uninterrupted(tmp_path):
    # derived seeds: a problem's requests do not depend on what else ran or on a restart
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    la, lb = FakeLLM(default_script), FakeLLM(default_script)
    _run(la, _cfg(a, rounds=(2,), n_problems=4, max_problems_in_flight=4))
    _run(lb, _cfg(b, rounds=(2,), n_problems=4, max_problems_in_flight=1))
    assert sorted((r, tuple(i), p.seed) for r, i, p in la.calls) == sorted((r, tuple(i), p.seed) for r, i, p in lb.calls)


def test_malformed_lines_skipped_with_error_records(tmp_path):
    data = tmp_path / "in.jsonl"
    _problems(data, 2)
    with open(data, "a") as f:
        f.write("{broken\n")
        f.write(json.dumps({"id": "nouser", "messages": [{"role": "assistant", "content": "x"}]}) + "\n")
    cfg = _cfg(tmp_path, rounds=(2,))
    summary = _run(FakeLLM(default_script), cfg)
    recs = {r["request_id"]: r for r in read_results(cfg.out_path)}
    assert set(recs) == {"p0", "p1", "req_2", "nouser"}  # req_{0-based index}, as the reference pipeline
    assert recs["req_2"]["line"] == 3 and "invalid JSON" in recs["req_2"]["error"]
    assert "no user message" in recs["nouser"]["error"]
    assert summary["errors"] == 2 and summary["completed"] == 2
    # resume does not redo or duplicate them
    cfg.resume = True
    llm = FakeLLM(default_script)
    _run(llm, cfg)
    assert llm.calls == [] and len(read_results(cfg.out_path)) == 4


def test_prompt_too_long_is_an_error_record_others_go_on(tmp_path):
    data = tmp_path / "in.jsonl"
    with open(data, "w") as f:
        for pid, text in [("short", "1+1?"), ("huge", "x" * 1000), ("short2", "2+2?")]:
            f.write(json.dumps({"id": pid, "messages": [{"role": "user", "content": text}]}) + "\n")
    llm = FakeLLM(lambda p, sp, rid, i: "ok \\boxed{2}", max_model_len=600)
    cfg = _cfg(tmp_path, rounds=(2,), max_tokens=50)
    summary = _run(llm, cfg)
    recs = {r["request_id"]: r for r in read_results(cfg.out_path)}
    assert "error" not in recs["short"] and "error" not in recs["short2"]
    assert "round 1" in recs["huge"]["error"] and "exceeds the context of 600" in recs["huge"]["error"]
    assert recs["huge"]["round_responses"] == []
    assert summary["errors"] == 1 and summary["completed"] == 2


def test_round2_too_long_without_cap_errors_with_partial_rounds(tmp_path):
    llm = FakeLLM(lambda p, sp, rid, i: "z" * 60 if rid.endswith("#r1") else "fin", max_model_len=300)
    cfg = _cfg(tmp_path, rounds=(4,), n_problems=1, max_tokens=60, message_token_cap=None)
    _run(llm, cfg)
    rec = read_results(cfg.out_path)[0]
    assert rec["error"].startswith("round 2:") and "--message-token-cap" in rec["error"]
    assert len(rec["round_responses"]) == 1 and len(rec["rounds_stats"]) == 1


def test_round2_auto_cap_fits(tmp_path):
    llm = FakeLLM(lambda p, sp, rid, i: "z" * 58 + f"E{i}" if rid.endswith("#r1") else "fin", max_model_len=600)
    cfg = _cfg(tmp_path, rounds=(4,), n_problems=1, max_tokens=60)
    _run(llm, cfg)
    rec = read_results(cfg.out_path)[0]
    assert "error" not in rec
    st = rec["rounds_stats"][1]
    assert st["truncated_messages"] == 4 and st["prompt_tokens"] + 60 <= 600
    prompt = llm.tokenizer.decode(llm.calls[-1][1])
    assert all(f"E{i}" in prompt for i in range(4))


def test_engine_value_error_is_an_error_record(tmp_path):
    class Refusing(FakeLLM):
        def add_request(self, prompt, params, request_id=None):
            if request_id.startswith("p1"):
                raise ValueError("needs more than the whole KV cache")
            return super().add_request(prompt, params, request_id)

    cfg = _cfg(tmp_path, rounds=(2,), n_problems=3)
    _run(Refusing(default_script), cfg)
    recs = {r["request_id"]: r for r in read_results(cfg.out_path)}
    assert "whole KV cache" in recs["p1"]["error"]
    assert "error" not in recs["p0"] and "error" not in recs["p2"]


def test_a_fixed_budget_at_the_context_is_refused_before_anything_runs(tmp_path):
    llm = FakeLLM(lambda p, sp, rid, i: "w" * 500, max_model_len=400)
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=1, max_tokens=400)
    with pytest.raises(ValueError, match="--max-tokens 400 leaves no room.*--max-tokens auto"):
        _run(llm, cfg)
    assert llm.calls == [] and not read_results(cfg.out_path)


def test_auto_budget_fills_the_context_in_every_round(tmp_path):
    llm = FakeLLM(lambda p, sp, rid, i: "w" * 2000, max_model_len=600)
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=1, max_tokens="auto")
    summary = _run(llm, cfg)
    assert len(llm.calls) == 2
    for _, ids, params in llm.calls:
        assert params.max_tokens == 600 - len(ids)
    rec = read_results(cfg.out_path)[0]
    s1, s2 = rec["rounds_stats"]
    assert s1["finish_reasons"] == {"length": 2} and s1["generated_tokens"] == 2 * (600 - s1["prompt_tokens"])
    assert all(t["tokens"] == 600 - s1["prompt_tokens"] for t in rec["round_responses"][0])
    assert s2["generated_tokens"] == 600 - s2["prompt_tokens"]
    assert summary["run"]["max_tokens"] == "auto"


def test_auto_budget_reports_the_reference_cut_per_round(tmp_path):
    llm = FakeLLM(lambda p, sp, rid, i: "z" * 150 + f"E{i}" if rid.endswith("#r1") else "fin", max_model_len=1000)
    cfg = _cfg(tmp_path, rounds=(4,), n_problems=1, max_tokens="auto")
    summary = _run(llm, cfg)
    s2 = read_results(cfg.out_path)[0]["rounds_stats"][1]
    assert s2["truncated_messages"] == 4 and s2["truncated_tokens"] > 0
    assert s2["prompt_tokens"] <= 1000 - 250  # a quarter of the context left to generate
    assert llm.calls[-1][2].max_tokens == 1000 - s2["prompt_tokens"]
    assert (summary["rounds"][1]["truncated_messages"], summary["rounds"][1]["truncated_tokens"]) == \
        (4, s2["truncated_tokens"])
    prompt = llm.tokenizer.decode(llm.calls[-1][1])
    assert all(f"E{i}" in prompt for i in range(4))


def test_no_ground_truth_is_not_graded(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"id": "q", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    cfg = _cfg(tmp_path, rounds=(2,))
    summary = _run(FakeLLM(lambda p, sp, rid, i: "\\boxed{1}"), cfg)
    rec = read_results(cfg.out_path)[0]
    assert rec["correct"] is None and rec["answer"] == "1"
    assert rec["self_consistency"]["correct"] is None
    assert summary["accuracy"] is None and summary["graded"] == 0


def test_run_pacore_prints_summary(tmp_path, capsys):
    cfg = _cfg(tmp_path, rounds=(2,), n_problems=2)
    run_pacore(FakeLLM(default_script), cfg)
    out = capsys.readouterr().out
    assert "accuracy (final answer): 100.0%" in out and "self-consistency" in out
    assert "effective test-time compute" in out and cfg.out_path in out


def test_cli_refuses_nonempty_output_before_loading_model(tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    _problems(data, 1)
    out = tmp_path / "out.jsonl"
    out.write_text('{"request_id": "p0"}\n')
    assert main(["run", "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "another --out" in err
    assert main(["run", "--data", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
