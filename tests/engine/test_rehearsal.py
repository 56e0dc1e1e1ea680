"""The rehearsal (LLM(device_model=...)) makes the engine's own decisions: a rehearsal given a real
run's trajectory lengths admits, preempts, forks and finishes exactly as that run did."""
import pytest

from engine import LLM, SamplingParams
from engine.core.observers import StepObserver
from engine.rehearsal.drafter import KINDS, DraftProfile, WindowProfile, use_scripted_drafter, use_scripted_self_drafts


class Plans(StepObserver):
    """Each step's decisions, by request id and child index (sequence ids differ between engines)."""

    def __init__(self):
        self.steps = []

    def step_planned(self, plan):
        self.steps.append((
            tuple((s.request.request_id, s.index, s.num_computed, n) for s, n in plan.prefills),
            tuple((s.request.request_id, s.index, s.num_computed) for s in plan.decodes),
            len(plan.copies), plan.cascade,
            tuple((s.request.request_id, s.index) for s in plan.sample_seqs)))


class Lengths:
    def __init__(self, table):
        self.table = table

    def lengths(self, request_id, index, prompt_tokens, max_tokens):
        return self.table[(request_id, index)], 0


PROMPTS = ["The quick brown fox " * 9, "Jumps over the lazy dog " * 7, "Pack my box with five dozen " * 5]
OPTIONS = dict(num_kv_blocks=26, max_num_seqs=6, max_num_batched_tokens=64, cascade_min_prefix=16,
               cascade_min_shared_tokens=0)


def _run(llm, observer):
    llm.add_observer(observer)
    for i, p in enumerate(PROMPTS):
        llm.add_request(p, SamplingParams(n=3, temperature=1.0, seed=i, max_tokens=60), request_id=f"q{i}")
    outs, finished = {}, []
    while llm.has_unfinished():
        for out in llm.step():
            finished.append(out.request_id)
            outs[out.request_id] = out
    return outs, finished


def test_a_rehearsal_makes_the_real_runs_decisions(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    real_plans = Plans()
    real = LLM(model, **OPTIONS)
    outs, real_order = _run(real, real_plans)
    assert real.scheduler.num_preemptions > 0  # the cache is small enough to preempt
    table = {}
    for rid, out in outs.items():
        for c in out.outputs:
            # a trajectory cut at max_tokens had no EOS: script one more token for the engine to cut
            table[(rid, c.index)] = len(c.token_ids) + (c.finish_reason == "length")

    rehearsal_plans = Plans()
    rehearsal = LLM(model, device_model="h200", **OPTIONS)
    rehearsal.sampler.workload = Lengths(table)
    routs, rehearsal_order = _run(rehearsal, rehearsal_plans)

    assert rehearsal.scheduler.num_preemptions == real.scheduler.num_preemptions
    assert rehearsal_plans.steps == real_plans.steps  # admissions, chunks, forks, cascade, samples
    assert rehearsal_order == real_order
    for rid, out in outs.items():
        assert [len(c.token_ids) for c in routs[rid].outputs] == [len(c.token_ids) for c in out.outputs]
        assert [c.finish_reason for c in routs[rid].outputs] == [c.finish_reason for c in out.outputs]
    # no weights, no KV tensor: only bookkeeping
    assert not hasattr(rehearsal.runner, "model") and rehearsal.runner.kv_cache is None
    assert rehearsal.runner.ledger.total.total == pytest.approx(rehearsal.clock())


def test_a_rehearsed_trajectory_ends_in_a_conclusion_of_its_length(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), device_model="h200", num_kv_blocks=64)
    llm.sampler.workload = Lengths({("a", i): 40 + 5 * i for i in range(3)})

    class Conclusions(Lengths):
        def lengths(self, request_id, index, prompt_tokens, max_tokens):
            return self.table[(request_id, index)], 12
    llm.sampler.workload = Conclusions(llm.sampler.workload.table)
    llm.add_request("hello", SamplingParams(n=3, max_tokens=100), request_id="a")
    while llm.has_unfinished():
        for out in llm.step():
            for c in out.outputs:
                assert len(c.token_ids) == 40 + 5 * c.index and c.finish_reason == "stop"
                message = c.text.rsplit("</think>", 1)[1]
                assert len(llm.tokenizer.encode(message, add_special_tokens=False)) == 12


@pytest.mark.parametrize("p", [0.0, 0.7, 1.0])
def test_a_rehearsal_with_speculation_emits_the_scripted_tokens_once_each(tiny_model_dir, p):
    """Drafts accepted with a flat probability p: the same trajectories as without speculation (with
    preemption), fewer steps, the ledger counting emitted tokens (not verify queries), every block back."""
    model = str(tiny_model_dir("qwen3"))
    table = {(f"q{i}", c): 30 + 7 * c + i for i in range(len(PROMPTS)) for c in range(3)}

    def run(spec):
        llm = LLM(model, device_model="h200", speculative_config=spec, **OPTIONS)
        llm.sampler.workload = Lengths(table)
        if spec:
            use_scripted_drafter(llm, dict.fromkeys(KINDS, DraftProfile.flat(p, 4)))
        outs, _ = _run(llm, StepObserver())
        return llm, {rid: [c.token_ids for c in out.outputs] for rid, out in outs.items()}

    plain, want = run(None)
    llm, got = run({"method": "ngram", "num_speculative_tokens": 4})
    assert got == want
    emitted = sum(len(t) for trajs in want.values() for t in trajs)
    assert sum(llm.runner.ledger.generated.values()) == sum(plain.runner.ledger.generated.values()) == emitted
    st = llm.stats()
    assert st["spec_decode_num_drafts"] > 0 and st["kv_blocks_used"] == 0 and st["preemptions"] > 0
    if p == 0.0:
        assert st["spec_decode_num_accepted_tokens"] == 0 and st["steps"] == plain.stats()["steps"]
    else:
        assert st["spec_decode_num_accepted_tokens"] > 0 and st["steps"] < plain.stats()["steps"]
        assert llm.clock() < plain.clock()  # fewer reads of the weights and the KV
    if p == 1.0:  # only a draft that runs past its trajectory's EOS loses tokens
        assert st["spec_decode_acceptance_rate"] > 0.8


SELF = {"method": "self_window", "num_speculative_tokens": 4, "window": 16, "sink": 4}


def _self_drafted(model, table, spec, p, **options):
    llm = LLM(model, device_model=options.pop("device_model", "h200"), speculative_config=spec, **(OPTIONS | options))
    llm.sampler.workload = Lengths(table)
    if spec:
        use_scripted_self_drafts(llm, WindowProfile.flat(p, spec["num_speculative_tokens"]))
    outs, _ = _run(llm, StepObserver())
    return llm, {rid: [c.token_ids for c in out.outputs] for rid, out in outs.items()}


@pytest.mark.parametrize("p", [0.0, 0.7, 1.0])
def test_a_rehearsal_with_self_drafting_charges_its_draft_steps(tiny_model_dir, p):
    """The engine's own self-drafting (fixed depth 4) with scripted draws: the same trajectories as without
    speculation, drafts accepted at p, each draft step charged to the clock and folded into its engine
    step's sample (one sample per step), every block back."""
    model = str(tiny_model_dir("qwen3"))
    table = {(f"q{i}", c): 30 + 7 * c + i for i in range(len(PROMPTS)) for c in range(3)}
    plain, want = _self_drafted(model, table, None, p)
    llm, got = _self_drafted(model, table, SELF | {"policy": "fixed"}, p)
    assert got == want
    led, st = llm.runner.ledger, llm.stats()
    assert sum(led.generated.values()) == sum(plain.runner.ledger.generated.values())
    assert st["kv_blocks_used"] == 0 and st["preemptions"] > 0 and st["spec_decode_num_drafts"] > 0
    first = st["spec_decode_num_accepted_tokens_per_pos"][0] / st["spec_decode_num_drafts"]
    assert first == pytest.approx(p, abs=0.1)  # the first draft of a verify step is accepted at p
    drafted = sum(c.total for c in led.drafts.values())
    assert drafted > 0 and len(led.steps) == st["steps"]
    assert sum(s.cost.total for s in led.steps) == pytest.approx(led.total.total) == pytest.approx(llm.clock())
    if p == 0.0:  # four draft steps and a verify pass for each token a plain step would give
        assert st["steps"] == plain.stats()["steps"] and llm.clock() > plain.clock() + drafted * 0.99


def test_a_layer_skip_draft_step_is_charged_its_layers(tiny_model_dir):
    """draft_layers=1 of the tiny model's 2: the same schedule and drafts (the same draws), each draft step
    charged half the layers' KV and the kept layer's weights with the whole LM head (issue 51 item 3)."""
    from dataclasses import replace
    model = str(tiny_model_dir("qwen3"))
    table = {(f"q{i}", c): 30 + 7 * c + i for i in range(len(PROMPTS)) for c in range(3)}
    full, want = _self_drafted(model, table, SELF | {"policy": "fixed"}, 0.7)
    skip, got = _self_drafted(model, table, SELF | {"policy": "fixed", "draft_layers": 1}, 0.7)
    assert got == want and skip.stats()["steps"] == full.stats()["steps"]
    f, s = ({p: sum(getattr(c, p) for c in llm.runner.ledger.drafts.values()) for p in ("weights", "kv_read")}
            for llm in (full, skip))
    shape = full.runner.shape
    assert s["weights"] / f["weights"] == pytest.approx(replace(shape, num_layers=1).weight_bytes / shape.weight_bytes)
    assert s["kv_read"] / f["kv_read"] == pytest.approx(0.5)
    assert skip.clock() < full.clock()


def test_a_rehearsals_depth_policy_prices_the_rehearsed_device(tiny_model_dir, tmp_path):
    """The policy's costs are the rehearsed device's, whatever cost_model says: on a device where reading
    KV costs 1000x reading weights, drafts that are always right are drafted as deep as allowed; on the
    assumed H200 the tiny model's steps are all launch overhead, and speculation stays off."""
    device = tmp_path / "kv_bound.json"
    device.write_text('{"attention_bw_eff": 0.001, "step_overhead_s": 0}')
    model = str(tiny_model_dir("qwen3"))
    table = {(f"q{i}", c): 60 for i in range(len(PROMPTS)) for c in range(3)}
    depths = {}
    for name in ("h200", str(device)):
        llm, _ = _self_drafted(model, table, SELF | {"window": 2, "sink": 0}, 1.0, device_model=name)
        steps = llm.stats()["spec_decode_depth_steps"]
        depths[name] = steps.get(4, 0) / sum(steps.values())
    assert depths[str(device)] > 0.7 and depths["h200"] < 0.1
