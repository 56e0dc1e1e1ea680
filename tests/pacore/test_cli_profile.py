"""`pacore run --profile`: each step of the timeline says which rounds (and problems) its tokens were
for, profile_summary.json has each round's throughput, and the torch.profiler traces (tens of MB)
are written only with --profile-traces."""
import json

from engine import LLM, SamplingParams
from engine.profiler import profiled, round_of

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


def test_round_of_reads_pacore_request_ids():
    assert round_of("apples#r1") == ("1", "apples")
    assert round_of("apples#run3#r2") == ("2", "apples")
    assert round_of("apples#pool#r1") == ("1", "apples")
    assert round_of("a%23b#r12") == ("12", "a%23b")  # an escaped '#' stays in the key
    assert round_of("7") is None and round_of("x#run2") is None and round_of("#r1") is None


def test_the_timeline_records_each_steps_round_mix(tiny_model_dir, tmp_path):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    params = SamplingParams(n=2, max_tokens=4, ignore_eos=True)
    plain_ops = llm.runner.ops
    with profiled(llm, str(tmp_path / "prof")) as prof:
        assert llm.runner.ops is plain_ops  # without traces the ops are not marked for the profiler
        llm.add_request(PROMPT, params, request_id="a#r1")
        llm.add_request(PROMPT, params, request_id="b#run1#r1")
        llm.step()  # round 1 of both problems
        llm.step()
        llm.add_request(PROMPT + "next", SamplingParams(max_tokens=3, ignore_eos=True), request_id="a#r2")
        while llm.has_unfinished():
            llm.step()
    lines = (tmp_path / "prof" / "timeline.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines[1:]]
    assert steps == prof.records and "meta" in json.loads(lines[0])
    assert steps[0]["label"] == "round1" and steps[0]["problems"] == 2
    assert steps[0]["rounds"] == {"1": {"prefill_tokens": steps[0]["num_tokens"], "decode_tokens": 0, "problems": 2}}
    assert any(s["label"] == "mixed" and set(s["rounds"]) == {"1", "2"} for s in steps)
    assert steps[-1]["label"] == "round2" and steps[-1]["problems"] == 1
    for s in steps:  # every token of a step is some round's
        assert sum(m["prefill_tokens"] + m["decode_tokens"] for m in s["rounds"].values()) == s["num_tokens"]
    summary = json.loads((tmp_path / "prof" / "profile_summary.json").read_text())
    r1, r2 = summary["rounds"]["1"], summary["rounds"]["2"]
    assert r1["decode_tokens"] == 2 * 2 * 3 and r2["decode_tokens"] == 2  # after each prefill's first token
    assert r1["steps"] == sum("1" in s["rounds"] for s in steps)
    assert r1["decode_tokens_per_s"] == r1["decode_tokens"] / r1["span_s"] > 0
    assert set(summary["labels"]) == {"round1", "mixed", "round2"}
    assert not list((tmp_path / "prof").glob("trace_*.json"))  # opt-in: --profile-traces


def test_profile_traces_are_opt_in_and_one_per_label(tiny_model_dir, tmp_path):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    with profiled(llm, str(tmp_path / "prof"), trace_steps=2):
        llm.add_request(PROMPT, SamplingParams(n=2, max_tokens=5, ignore_eos=True), request_id="a#r1")
        while llm.has_unfinished():
            llm.step()
    # the first step's label is known once planned, after its trace began: filed under "run"
    assert sorted(p.name for p in (tmp_path / "prof").glob("trace_*.json")) == ["trace_round1.json", "trace_run.json"]


def test_profile_flags(tmp_path):
    from pacore.cli import build_parser
    from pacore.cli.run import _config

    args = build_parser().parse_args(["run", "--data", "d", "--out", "o", "--profile", "p"])
    assert _config(args, "d", "o", False).profile_trace_steps == 0
    args = build_parser().parse_args(["run", "--data", "d", "--out", "o", "--profile", "p", "--profile-traces", "4"])
    assert _config(args, "d", "o", False).profile_trace_steps == 4
