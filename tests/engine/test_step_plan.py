"""The scheduler's StepPlan (forks, copies, cascade groups, sample rows) and the step observer."""
import shutil

import pytest

from engine import LLM, SamplingParams
from engine.core.observers import StepObserver

PROMPT = list(range(3, 40))  # 37 tokens: two full 16-token blocks and a partial one


def _plans(llm):
    """Record every plan the runner receives, with what it held before the step ran."""
    seen, run = [], llm.runner.run

    def spy(plan):
        seen.append(dict(prefills=[(s.request.request_id, s.index, c) for s, c in plan.prefills],
                         decodes=[(s.request.request_id, s.index) for s in plan.decodes],
                         copies=list(plan.copies), rows=list(plan.sample_rows),
                         samples=[(s.request.request_id, s.index) for s in plan.sample_seqs],
                         groups=(list(plan.group_starts), list(plan.group_prefix_lens))))
        return run(plan)
    llm.runner.run = spy
    return seen


def test_a_fork_and_its_copies_are_in_the_plan(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    seen = _plans(llm)
    llm.generate([PROMPT], SamplingParams(n=4, temperature=1, seed=0, max_tokens=3, ignore_eos=True),
                 use_tqdm=False)
    first = seen[0]
    assert first["prefills"] == [("0", 0, 37)]  # the prompt once
    # three children share the two full blocks and each gets a copy of the partial third one
    parent_partial = {src for src, _ in first["copies"]}
    assert len(first["copies"]) == 3 and len(parent_partial) == 1
    assert len({dst for _, dst in first["copies"]}) == 3
    # the prompt's one logits row is sampled four times: parent and children
    assert first["rows"] == [0, 0, 0, 0] and sorted(i for _, i in first["samples"]) == [0, 1, 2, 3]
    second = seen[1]
    assert sorted(i for _, i in second["decodes"]) == [0, 1, 2, 3] and second["copies"] == []
    assert second["rows"] == [0, 1, 2, 3]


def test_decode_rows_are_grouped_by_request_with_their_shared_prefix(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=128, max_model_len=256, cascade_attention=True)
    seen = _plans(llm)
    other = list(range(50, 90))  # 40 tokens: two full blocks
    llm.generate([PROMPT, other], SamplingParams(n=3, temperature=1, seed=0, max_tokens=3, ignore_eos=True),
                 use_tqdm=False)
    decode = next(p for p in seen if len(p["decodes"]) == 6)
    owners = [rid for rid, _ in decode["decodes"]]
    assert owners == sorted(owners, key=owners.index) and owners[:3] == [owners[0]] * 3  # contiguous
    starts, prefix_lens = decode["groups"]
    assert starts == [0, 3, 6] and prefix_lens == [32, 32]  # each group shares its two full blocks
    assert llm.stats()["cascade_decode_steps"] > 0


def test_no_groups_when_cascade_is_off(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256, cascade_attention=False)
    seen = _plans(llm)
    llm.generate([PROMPT], SamplingParams(n=3, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert all(p["groups"] == ([], []) for p in seen) and llm.stats()["cascade_decode_steps"] == 0


class Recorder(StepObserver):
    def __init__(self):
        self.events = []

    def step_started(self):
        self.events.append("started")

    def step_planned(self, plan):
        self.events.append(("planned", plan.num_tokens))

    def step_finished(self, record):
        self.events.append(("finished", record.kind, record.num_tokens))


def test_observer_sees_every_step_in_order(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    obs = Recorder()
    llm.add_observer(obs)
    llm.generate([PROMPT], SamplingParams(n=2, max_tokens=4, ignore_eos=True), use_tqdm=False)
    steps = llm.stats()["steps"]
    assert obs.events[:3] == ["started", ("planned", 37), ("finished", "prefill", 37)]
    assert obs.events.count("started") == steps and len(obs.events) == 3 * steps
    assert obs.events[-1] == ("finished", "decode", 2)
    llm.remove_observer(obs)
    llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(obs.events) == 3 * steps and not llm.step_log  # detached; no log unless record_steps


def test_profile_session_is_an_observer(tiny_model_dir, tmp_path):
    from engine.profiler import ProfileSession
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    plain_ops = llm.runner.ops
    with ProfileSession(llm, tmp_path / "prof", trace_steps=2, plot=False) as prof:
        assert llm.runner.ops is not plain_ops  # ops marked with profiler ranges while attached
        llm.generate([PROMPT], SamplingParams(n=2, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert llm.runner.ops is plain_ops and not llm.observers
    assert [r["kind"] for r in prof.records] == ["prefill", "decode", "decode"]
    assert prof.records[1]["decode_rows"] == 2 and prof.records[0]["new_tokens"] == 37
    assert (tmp_path / "prof" / "timeline.jsonl").is_file() and (tmp_path / "prof" / "trace_run.json").is_file()


def test_token_ids_only_without_a_tokenizer(tiny_model_dir, tmp_path):
    """A checkpoint folder without tokenizer files loads with skip_tokenizer_init, or tokenizer=."""
    src = tiny_model_dir("llama")
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in src.iterdir():
        if f.name in ("config.json", "generation_config.json") or f.suffix == ".safetensors":
            shutil.copy(f, bare / f.name)
    with pytest.raises(ValueError, match="skip_tokenizer_init=True"):
        LLM(str(bare), num_kv_blocks=32)
    llm = LLM(str(bare), num_kv_blocks=32, skip_tokenizer_init=True)
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    out = llm.generate([PROMPT], greedy, use_tqdm=False)[0].outputs[0]
    full = LLM(str(src), num_kv_blocks=32).generate([PROMPT], greedy, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full.token_ids and out.text == ""
    with pytest.raises(ValueError, match="needs a tokenizer"):
        llm.add_request("text", greedy)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        llm.add_request(PROMPT, SamplingParams(stop=["x"]))
    named = LLM(str(bare), num_kv_blocks=32, tokenizer=str(src))
    assert named.generate(["ab"], greedy, use_tqdm=False)[0].outputs[0].text != ""


def test_unknown_option_names_the_valid_ones(tiny_model_dir):
    with pytest.raises(TypeError, match=r"\['max_num_seq'\].*'max_num_seqs'"):
        LLM(str(tiny_model_dir("llama")), max_num_seq=4)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        LLM(str(tiny_model_dir("llama")), block_size=0)
