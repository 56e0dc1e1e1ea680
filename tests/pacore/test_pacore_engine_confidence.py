"""--record-confidence on the real engine (a tiny random Qwen3 written by transformers): the measures are
those of the engine's own logprobs of each trajectory, asking for them changes no token, and a round
stopped mid-way resumes to the measures of one never stopped."""
import json

import pytest

engine = pytest.importorskip("engine")
from tiny_models import make_tiny_model  # noqa: E402

from pacore.config import RunConfig  # noqa: E402
from pacore.evaluate.confidence import TOP_K  # noqa: E402
from pacore.results.files import read_results  # noqa: E402
from pacore.runner import PaCoReRunner  # noqa: E402


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("pacore_conf") / "qwen3", "qwen3")


@pytest.fixture
def problems(tmp_path):
    path = tmp_path / "in.jsonl"
    with open(path, "w") as f:
        for i in range(2):
            f.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
                                "ground_truth": {"answer": str(2 * i)}}) + "\n")
    return path


def _cfg(problems, name, **kw):
    return RunConfig(str(problems), str(problems.parent / name), rounds=(3,), max_tokens=24, show_progress=False,
                     checkpoint_every_s=0, **kw)


class _CapturingLLM(engine.LLM):
    """The real engine, keeping each finished trajectory's logprobs before the runner lets them go."""

    def step(self):
        finished = super().step()
        self.seen = getattr(self, "seen", {})
        self.outputs = getattr(self, "outputs", [])
        for out in finished:
            for c in out.outputs:
                self.seen[(out.request_id, c.index)] = (list(c.token_ids), c.logprobs[:])
                self.outputs.append(c)
        return finished


class _ResumingLLM(engine.LLM):
    """The real engine, noting the logprobs each resumed request was given."""

    def add_request(self, prompt, params=None, request_id=None, resume=None, resume_logprobs=None):
        self.given = getattr(self, "given", {})
        self.given[request_id] = resume_logprobs
        return super().add_request(prompt, params, request_id=request_id, resume=resume,
                                   resume_logprobs=resume_logprobs)


class _StoppedLLM(engine.LLM):
    """The real engine, stopped by a Ctrl-C after 8 steps."""

    def step(self):
        if self.stats()["steps"] >= 8:
            raise KeyboardInterrupt
        return super().step()


def _trajectories(path):
    """(request id of its round, child index) -> its record, for every trajectory of every round."""
    return {(f"{r['request_id']}#r{n}", t["index"]): t for r in read_results(str(path))
            for n, rnd in enumerate(r["round_responses"], start=1) for t in rnd}


def test_the_measures_are_those_of_the_engines_logprobs_and_change_no_token(tiny_qwen3, problems):
    llm = _CapturingLLM(model=str(tiny_qwen3), num_kv_blocks=512)
    PaCoReRunner(llm, _cfg(problems, "conf.jsonl", record_confidence=True)).run()
    PaCoReRunner(engine.LLM(model=str(tiny_qwen3), num_kv_blocks=512), _cfg(problems, "plain.jsonl")).run()
    conf, plain = _trajectories(problems.parent / "conf.jsonl"), _trajectories(problems.parent / "plain.jsonl")
    assert conf.keys() == plain.keys() == llm.seen.keys() and len(conf) == 2 * (3 + 1)
    for key, t in conf.items():
        assert t["content"] == plain[key]["content"] and t["tokens"] == plain[key]["tokens"]  # same tokens
        assert "mean_logprob" not in plain[key]
        token_ids, lp = llm.seen[key]
        assert lp.token_ids == token_ids and lp.num_top == TOP_K and len(token_ids) == t["tokens"]
        # by the spec's per-position API, in plain Python: shorter than 2048, so one group
        chosen = lp.logprobs
        conf_i = [-sum(v for _, v in lp.top(i)) / TOP_K for i in range(len(lp))]
        assert t["mean_logprob"] == pytest.approx(sum(chosen) / len(chosen), rel=1e-9)
        assert t["lowest_group_confidence"] == pytest.approx(sum(conf_i) / len(conf_i), rel=1e-9)
        assert t["mean_logprob"] < 0 < t["lowest_group_confidence"]
    assert all(c.logprobs is None for c in llm.outputs)  # let go once reduced


@pytest.mark.parametrize("stopped_with_logprobs, batch_invariant", [(True, True), (True, False), (False, False)])
def test_stopped_mid_round_then_resumed_gives_the_measures_of_a_run_never_stopped(tiny_qwen3, problems,
                                                                                  stopped_with_logprobs,
                                                                                  batch_invariant):
    """Bit for bit with a snapshot that holds the logprobs and --batch-invariant; without it the positions
    decoded after the resume see a KV that its prefill rounded differently, and from a snapshot without
    logprobs the engine recomputes them: within float rounding."""
    opts = dict(model=str(tiny_qwen3), num_kv_blocks=512, batch_invariant=batch_invariant)
    PaCoReRunner(engine.LLM(**opts), _cfg(problems, "whole.jsonl", record_confidence=True)).run()
    with pytest.raises(KeyboardInterrupt):
        PaCoReRunner(_StoppedLLM(**opts), _cfg(problems, "cut.jsonl", record_confidence=stopped_with_logprobs)).run()
    assert not read_results(str(problems.parent / "cut.jsonl"))
    assert len(list((problems.parent / "cut.jsonl.partial").iterdir())) == 2  # both round-1 requests, mid-way
    llm = _ResumingLLM(**opts)
    PaCoReRunner(llm, _cfg(problems, "cut.jsonl", record_confidence=True, resume=True)).run()
    for rid in ("p0#r1", "p1#r1"):
        given = llm.given[rid]
        assert (given is not None) == stopped_with_logprobs
        assert given is None or all(0 < len(lp) < 24 for lp in given)
    cut, whole = _trajectories(problems.parent / "cut.jsonl"), _trajectories(problems.parent / "whole.jsonl")
    assert {k: t["content"] for k, t in cut.items()} == {k: t["content"] for k, t in whole.items()}
    for key, t in cut.items():
        got = (t["mean_logprob"], t["lowest_group_confidence"])
        want = (whole[key]["mean_logprob"], whole[key]["lowest_group_confidence"])
        if stopped_with_logprobs and batch_invariant:  # the earlier positions' logprobs from the snapshot
            assert got == want
        else:
            assert got == pytest.approx(want, abs=1e-5)
