"""pacore on the real engine, with a tiny random Qwen3 checkpoint written by transformers."""
import json

import pytest

engine = pytest.importorskip("engine")
from tiny_models import make_tiny_model  # noqa: E402

from pacore.cli import main  # noqa: E402
from pacore.config import RunConfig  # noqa: E402
from pacore.results.files import read_results  # noqa: E402
from pacore.runner import PaCoReRunner  # noqa: E402
from pacore.results.files import summary_path  # noqa: E402


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("pacore_tiny") / "qwen3", "qwen3")


def _problems(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"What is {i}+{i}? Think."}],
                                "ground_truth": {"answer": str(2 * i)}}) + "\n")


def test_rounds_on_the_real_engine(tiny_qwen3, tmp_path):
    llm = engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512, seed=0)
    _problems(tmp_path / "in.jsonl", 3)
    cfg = RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), rounds=(3,), max_tokens=10,
                    show_progress=False, max_problems_in_flight=2)
    summary = PaCoReRunner(llm, cfg).run()
    recs = read_results(cfg.out_path)
    assert sorted(r["request_id"] for r in recs) == ["p0", "p1", "p2"]
    stats = llm.stats()
    rounds = [s for r in recs for s in r["rounds_stats"]]
    # one request per round: every prompt token was prefilled (or found in the prefix cache) exactly
    # once, although round 1 decodes 3 trajectories from it
    assert stats["prefill_tokens"] + stats["prefix_cache_hit_tokens"] == sum(s["prompt_tokens"] for s in rounds)
    assert stats["decode_tokens"] <= sum(s["generated_tokens"] for s in rounds)
    for r in recs:
        r1, r2 = r["rounds_stats"]
        assert (r1["k"], r2["k"]) == (3, 1)
        assert r1["generated_tokens"] <= 30 and r1["prompt_tokens"] >= 16
        assert r1["kv_blocks_saved_by_sharing"] >= 2  # 2 children share the prompt's full block(s)
        assert r2["references"] + r2["dropped_messages"] == 3
        assert r2["prompt_tokens"] + 10 <= llm.max_model_len
        texts = [t["content"] for t in r["round_responses"][0]]
        assert len(set(texts)) > 1, "trajectories of one request must be sampled independently"
    assert summary["completed"] == 3 and summary["run"]["engine_stats"]["prefill_tokens"] > 0


def test_auto_cap_keeps_round_prompt_in_a_small_context(tiny_qwen3, tmp_path):
    # a 512-token context: template (~330 byte tokens) + 4 references of 40 tokens + 40 generated
    llm = engine.LLM(model=str(tiny_qwen3), num_kv_blocks=256, max_model_len=512, seed=1)
    _problems(tmp_path / "in.jsonl", 1)
    cfg = RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), rounds=(4,), max_tokens=40,
                    show_progress=False)
    PaCoReRunner(llm, cfg).run()
    rec = read_results(cfg.out_path)[0]
    assert "error" not in rec, rec.get("error")
    r2 = rec["rounds_stats"][1]
    assert r2["prompt_tokens"] + 40 <= 512
    assert r2["references"] == 4 and r2["truncated_messages"] > 0


def test_cli_run_with_a_model_folder(tiny_qwen3, tmp_path, capsys):
    _problems(tmp_path / "in.jsonl", 2)
    out = tmp_path / "res.jsonl"
    args = ["run", "--model", str(tiny_qwen3), "--data", str(tmp_path / "in.jsonl"), "--out", str(out),
            "--rounds", "2", "--max-tokens", "6", "--num-kv-blocks", "256", "--no-progress", "--seed", "3"]
    assert main(args) == 0
    assert len(read_results(str(out))) == 2
    summary = json.loads(open(summary_path(str(out))).read())
    assert summary["config"]["engine_options"]["model"] == str(tiny_qwen3)
    assert "accuracy (final answer)" in capsys.readouterr().out
    # the same command again is refused; with --resume it has nothing left to do
    assert main(args) == 2
    assert main(args + ["--resume"]) == 0
    assert len(read_results(str(out))) == 2


def test_cli_profile_writes_timeline_and_kv_plot(tiny_qwen3, tmp_path):
    _problems(tmp_path / "in.jsonl", 2)
    prof = tmp_path / "prof"
    args = ["run", "--model", str(tiny_qwen3), "--data", str(tmp_path / "in.jsonl"), "--out",
            str(tmp_path / "res.jsonl"), "--rounds", "3", "--max-tokens", "6", "--num-kv-blocks", "256",
            "--no-progress", "--profile", str(prof)]
    assert main(args) == 0
    lines = [json.loads(x) for x in (prof / "timeline.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "kind" in x]
    kinds = {s["kind"] for s in steps}
    assert "decode" in kinds and kinds & {"prefill", "mixed"}
    assert any(s["kv_blocks_shared"] > 0 for s in steps)  # the 3 trajectories share their prompt
    assert (prof / "kv_blocks.png").stat().st_size > 0


class _StoppedLLM(engine.LLM):
    """The real engine, stopped by a Ctrl-C after a number of steps."""

    stop_after = 8

    def step(self):
        if self.stats()["steps"] >= self.stop_after:
            raise KeyboardInterrupt
        return super().step()


def test_stopped_mid_round_then_resumed_equals_never_stopped(tiny_qwen3, tmp_path):
    _problems(tmp_path / "in.jsonl", 2)

    def cfg(name, **kw):
        return RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / name), rounds=(3,), max_tokens=24,
                         show_progress=False, checkpoint_every_s=0, **kw)

    PaCoReRunner(engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512), cfg("whole.jsonl")).run()
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(_StoppedLLM(model=str(tiny_qwen3), num_kv_blocks=512), cfg("cut.jsonl")).run()
    assert not read_results(str(tmp_path / "cut.jsonl"))
    assert len(list((tmp_path / "cut.jsonl.partial").iterdir())) == 2  # both round-1 requests, mid-way
    PaCoReRunner(engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512), cfg("cut.jsonl", resume=True)).run()

    def tokens(name):  # every trajectory's text, every round
        return {r["request_id"]: r["round_responses"] for r in read_results(str(tmp_path / name))}
    assert tokens("cut.jsonl") == tokens("whole.jsonl")


class _RecordingLLM(engine.LLM):
    """The real engine, noting each request's prompt length and budget."""

    def add_request(self, prompt, params=None, request_id=None, resume=None, resume_logprobs=None):
        self.budgets = getattr(self, "budgets", [])
        self.budgets.append((request_id, len(prompt), params.max_tokens))
        return super().add_request(prompt, params, request_id=request_id, resume=resume,
                                   resume_logprobs=resume_logprobs)


def test_auto_budget_fills_a_small_context_on_the_real_engine(tiny_qwen3, tmp_path):
    # A 128-token context: round 1 (a 37-token prompt) generates until the context is full; round 2's
    # template alone does not fit, which is a clear error record that keeps round 1.
    llm = _RecordingLLM(model=str(tiny_qwen3), num_kv_blocks=64, max_model_len=128, seed=0)
    _problems(tmp_path / "in.jsonl", 1)
    cfg = RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), rounds=(3,), max_tokens="auto",
                    show_progress=False)
    PaCoReRunner(llm, cfg).run()
    [(rid, prompt_len, budget)] = llm.budgets
    assert rid == "p0#r1" and budget == 128 - prompt_len
    rec = read_results(cfg.out_path)[0]
    [r1] = rec["rounds_stats"]
    assert r1["prompt_tokens"] == prompt_len
    trajs = rec["round_responses"][0]
    assert all(t["tokens"] <= budget for t in trajs)
    ran_out = [t for t in trajs if t["finish_reason"] == "length"]
    assert ran_out and all(t["tokens"] == 128 - prompt_len for t in ran_out)
    assert rec["error"].startswith("round 2:") and "context of 128" in rec["error"] and "--max-model-len" in rec["error"]


def test_cli_rope_scaling_and_context_reach_the_engine(tiny_qwen3, tmp_path):
    _problems(tmp_path / "in.jsonl", 1)
    out = tmp_path / "res.jsonl"
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    args = ["run", "--model", str(tiny_qwen3), "--data", str(tmp_path / "in.jsonl"), "--out", str(out),
            "--rounds", "2", "--max-tokens", "6", "--num-kv-blocks", "256", "--no-progress",
            "--max-model-len", "2048", "--rope-scaling", json.dumps(yarn)]
    assert main(args) == 0
    summary = json.loads(open(summary_path(str(out))).read())
    assert summary["config"]["engine_options"]["rope_scaling"] == yarn
    assert summary["run"]["max_model_len"] == 2048 and summary["completed"] == 1


def test_cli_refuses_a_fixed_budget_beyond_the_context(tiny_qwen3, tmp_path, capsys):
    _problems(tmp_path / "in.jsonl", 1)
    base = ["run", "--model", str(tiny_qwen3), "--data", str(tmp_path / "in.jsonl"), "--no-progress",
            "--num-kv-blocks", "256"]
    # known from the flags: refused before the model loads
    assert main(base + ["--out", str(tmp_path / "a.jsonl"), "--max-tokens", "300", "--max-model-len", "300"]) == 2
    assert "--max-tokens 300 leaves no room" in capsys.readouterr().err
    # known once the model is loaded (its config says 1024): refused before anything runs
    assert main(base + ["--out", str(tmp_path / "b.jsonl"), "--max-tokens", "1024"]) == 2
    err = capsys.readouterr().err
    assert "context of 1024" in err and "--max-tokens auto" in err
    assert not read_results(str(tmp_path / "b.jsonl"))


def test_runs_prefill_the_round1_prompt_once_through_the_prefix_cache(tiny_qwen3, tmp_path):
    llm = engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512, seed=0)
    _problems(tmp_path / "in.jsonl", 1)
    cfg = RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), rounds=(2,), max_tokens=8, runs=3,
                    show_progress=False)
    summary = PaCoReRunner(llm, cfg).run()
    recs = sorted(read_results(cfg.out_path), key=lambda r: r["run"])
    assert [r["run"] for r in recs] == [0, 1, 2] and summary["runs"] == 3
    round1 = [r["rounds_stats"][0] for r in recs]
    prompt = round1[0]["prompt_tokens"]
    assert {s["prompt_tokens"] for s in round1} == {prompt}
    # the first run's request computes the prompt; the others find its full blocks in the prefix cache
    full_blocks = (prompt - 1) // llm.block_size * llm.block_size
    assert full_blocks > 0
    assert sorted(s["prefix_cache_hit_tokens"] for s in round1) == [0, full_blocks, full_blocks]
    texts = [[t["content"] for t in r["round_responses"][0]] for r in recs]
    assert texts[0] != texts[1] != texts[2]  # independent runs sample differently


def test_pool_on_the_real_engine(tiny_qwen3, tmp_path):
    llm = engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512, seed=0)
    _problems(tmp_path / "in.jsonl", 1)
    cfg = RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), rounds=(2,), max_tokens=8, runs=3,
                    pool=4, show_progress=False)
    summary = PaCoReRunner(llm, cfg).run()
    recs = read_results(cfg.out_path)
    assert len(recs) == 3 and all("error" not in r for r in recs)
    pool_tokens = recs[0]["pool"]["generated_tokens"]
    assert pool_tokens == recs[0]["pool"]["stats"]["generated_tokens"] > 0
    later = sum(r["rounds_stats"][1]["generated_tokens"] for r in recs)
    assert summary["generated_tokens_total"] == pool_tokens + later == summary["run"]["generated_tokens"]
    assert summary["effective_compute_tokens_total"] == sum(s["generated_tokens"] for r in recs for s in r["rounds_stats"])


def test_a_failed_engine_step_loses_nothing(tiny_qwen3, tmp_path):
    """A step that fails mid-round (a device error) fails only the rounds it ran: their tokens are
    snapshotted and their problems recorded as failed; the other problems finish; --resume then
    completes the failed ones exactly as a run that never failed."""
    _problems(tmp_path / "in.jsonl", 3)

    def cfg(name, **kw):
        return RunConfig(str(tmp_path / "in.jsonl"), str(tmp_path / name), rounds=(3,), max_tokens=16,
                         show_progress=False, checkpoint_every_s=0, max_problems_in_flight=1, **kw)

    PaCoReRunner(engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512), cfg("whole.jsonl")).run()
    llm = engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512)
    run = llm.runner.run

    def flaky(batch):  # p1's round 1 fails after 5 tokens
        if any(s.request.request_id.startswith("p1#") and s.num_generated == 5 for s in batch.decodes):
            llm.runner.run = run
            raise RuntimeError("simulated device error")
        return run(batch)
    llm.runner.run = flaky
    summary = PaCoReRunner(llm, cfg("cut.jsonl")).run()
    recs = read_results(str(tmp_path / "cut.jsonl"))
    assert sorted(r["request_id"] for r in recs if "error" not in r) == ["p0", "p2"]
    [failed] = [r for r in recs if "error" in r]
    assert failed["request_id"] == "p1" and "simulated device error" in failed["error"]
    assert summary["completed"] == 2
    assert len(list((tmp_path / "cut.jsonl.partial").iterdir())) == 1  # p1's 3 trajectories, 5 tokens each

    PaCoReRunner(engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512), cfg("cut.jsonl", resume=True)).run()

    def done(name):
        return {r["request_id"]: r["round_responses"] for r in read_results(str(tmp_path / name)) if "error" not in r}
    assert done("cut.jsonl") == done("whole.jsonl")
