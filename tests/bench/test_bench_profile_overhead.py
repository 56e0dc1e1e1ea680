"""bench.profile_run --overhead: what `pacore run --profile` adds to each step, timed from its own hooks
(the figure docs/pacore-runs.md quotes)."""
import json

from bench.profile_run import profile_overhead
from engine import LLM


def test_overhead_times_the_sessions_hooks_against_the_steps(tiny_model_dir, tmp_path):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    o = profile_overhead(llm, problems=2, k=2, prompt_len=8, gen_len=3, out_dir=tmp_path / "p")
    assert o["steps"] > 0 and 0 < o["hook_s"] < o["steps_s"] and 0 < o["hook_share"] < 1 and o["write_s"] > 0
    steps = [json.loads(line) for line in (tmp_path / "p" / "timeline.jsonl").read_text().splitlines()[1:]]
    assert len(steps) == o["steps"] and steps[0]["rounds"]["1"]["problems"] == 2  # recorded as --profile does
    assert not list((tmp_path / "p").glob("trace_*.json"))
