"""--speculative-config on `pacore run`, `demo` and `serve`: it reaches every engine (replicas too), a bad
value is a clear exit 2 before anything loads, a run with it writes the results a run without it writes
(so --resume does not compare it), and the summary's round table gains the drafts and acceptance."""
import json
import shutil

import pytest

from pacore.cli import main
from pacore.results.files import read_results, summary_path
from pacore.results.settings import settings_path

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
COUNTS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
          "spec_decode_num_emitted_tokens")


def _problems(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"What is {i}+{i}? {i}+{i}"}],
                                "ground_truth": {"answer": str(2 * i)}}) + "\n")


def _capture_llm(monkeypatch) -> dict:
    """engine.LLM replaced: the keyword arguments it is called with land in the dict returned, and the
    command stops there (SystemExit 3), no engine built."""
    import engine

    seen = {}

    def fake(*args, **kw):
        seen.update(kw)
        raise SystemExit(3)
    monkeypatch.setattr(engine, "LLM", fake)
    return seen


def _engine_options(monkeypatch, argv) -> dict:
    """The keyword arguments the command builds its engine with."""
    seen = _capture_llm(monkeypatch)
    with pytest.raises(SystemExit):
        main(argv)
    return seen


@pytest.mark.parametrize("command", ["run", "demo", "serve"])
def test_the_flag_reaches_the_engine(tmp_path, monkeypatch, command):
    if command == "serve":
        pytest.importorskip("fastapi")
    _problems(tmp_path / "in.jsonl", 1)
    paths = {"run": ["--data", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl")],
             "demo": ["--out", str(tmp_path / "o.jsonl")], "serve": []}[command]
    seen = _engine_options(monkeypatch, [command, *paths, "--speculative-config", json.dumps(SPEC)])
    assert seen["speculative_config"] == SPEC


def test_replicas_build_their_engines_with_it(tmp_path, monkeypatch):
    # --data-parallel processes and Ray actors each call build_llm(cfg) on the RunConfig the driver made
    from pacore.cli import build_llm, build_parser
    from pacore.cli.run import _config

    _problems(tmp_path / "in.jsonl", 1)
    args = build_parser().parse_args(["run", "--data", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o"),
                                      "--data-parallel", "2", "--speculative-config", json.dumps(SPEC)])
    cfg = _config(args, args.data, args.out, False)
    assert cfg.engine.speculative_config == SPEC
    seen = _capture_llm(monkeypatch)
    with pytest.raises(SystemExit):
        build_llm(cfg)
    assert seen["speculative_config"] == SPEC


@pytest.mark.parametrize("command", ["run", "demo", "serve"])
@pytest.mark.parametrize("value,said", [
    ("{bad", "not valid JSON"), ('{"draft_model": "x"}', "unknown key(s) ['draft_model']"),
    ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be an integer >= 1"),
    ('{"method": "eagle"}', "method must be one of ['ngram', "), ("[]", "non-empty JSON object"),
    ('{"method": "self_window", "selected": -16}', "selected must be an integer >= 0"),
    ('{"method": "self_window", "selection": "verify"}', "selection 'verify'"),
])
def test_a_bad_value_exits_2_naming_the_key(tmp_path, capsys, command, value, said):
    paths = {"run": ["--data", "x", "--out", str(tmp_path / "o")], "demo": [], "serve": []}[command]
    with pytest.raises(SystemExit) as e:
        main([command, *paths, "--speculative-config", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --speculative-config: " in err and said in err
    assert not (tmp_path / "o").exists()


def _comparable(path):
    """Each record's content, without what depends on timing or on the engine's way of computing it."""
    def drawn(pool):
        return pool and (pool["size"], pool["indices"], pool["generated_tokens"])
    return {(r["request_id"], r.get("run", 0)): (r["final_response"], r["round_responses"], drawn(r.get("pool")),
                                                 [(s["k"], s["generated_tokens"], s["answers"], s["finish_reasons"])
                                                  for s in r["rounds_stats"]])
            for r in read_results(path)}


@pytest.mark.slow  # three runs on the tiny engine, one of them on two replicas
def test_a_run_with_speculation_writes_the_results_of_one_without(tiny_model_dir, tmp_path, capsys):
    _problems(tmp_path / "in.jsonl", 2)

    def run(out, *extra):
        return main(["run", "--model", str(tiny_model_dir("qwen3_sharp")), "--data", str(tmp_path / "in.jsonl"),
                     "--out", str(tmp_path / out), "--rounds", "2", "--runs", "2", "--pool", "4", "--max-tokens",
                     "16", "--num-kv-blocks", "256", "--batch-invariant", "--no-progress", *extra])

    assert run("plain.jsonl") == 0
    assert "drafted" not in capsys.readouterr().out  # no speculation: the table as it was
    plain = _comparable(tmp_path / "plain.jsonl")
    assert len(plain) == 4 and not any("spec_decode_num_drafts" in s for r in read_results(tmp_path / "plain.jsonl")
                                       for s in r["rounds_stats"])
    # The same run with speculation, on two replicas: the same records, and the drafts per round.
    assert run("spec.jsonl", "--speculative-config", json.dumps(SPEC), "--data-parallel", "2") == 0
    out = capsys.readouterr().out
    assert _comparable(tmp_path / "spec.jsonl") == plain
    summary = json.loads(open(summary_path(str(tmp_path / "spec.jsonl"))).read())
    engine = summary["run"]["engine_stats"]  # the replicas' counters added up
    assert 0 < engine["spec_decode_num_accepted_tokens"] < engine["spec_decode_num_draft_tokens"]
    assert engine["spec_decode_acceptance_rate"] == (engine["spec_decode_num_accepted_tokens"]
                                                      / engine["spec_decode_num_draft_tokens"])
    assert sum(engine["spec_decode_num_accepted_tokens_per_pos"]) == engine["spec_decode_num_accepted_tokens"]
    rounds = summary["rounds"]
    for name in COUNTS:  # every request was a round, and the pool's is counted once (in round 1)
        assert sum(r[name] for r in rounds) == engine[name], name
    for r in rounds:
        assert r["spec_decode_acceptance_rate"] == r["spec_decode_num_accepted_tokens"] / r["spec_decode_num_draft_tokens"]
        assert r["spec_decode_mean_tokens_per_verify"] == r["spec_decode_num_emitted_tokens"] / r["spec_decode_num_drafts"]
    header = next(line for line in out.splitlines() if "tok/s" in line and "round" in line)
    assert header.endswith("drafted  accepted acc rate tok/verify")
    row = next(line for line in out.splitlines() if line.split()[:2] == ["1", "2"])  # round 1, K=2
    assert row.split()[-4:] == [str(rounds[0]["spec_decode_num_draft_tokens"]),
                                str(rounds[0]["spec_decode_num_accepted_tokens"]),
                                f"{100 * rounds[0]['spec_decode_acceptance_rate']:.1f}%",
                                f"{rounds[0]['spec_decode_mean_tokens_per_verify']:.2f}"]
    # Not a setting --resume compares: a results file begun without it is completed with it, the same.
    first = (tmp_path / "plain.jsonl").read_text().splitlines(keepends=True)[0]
    (tmp_path / "mixed.jsonl").write_text(first)
    shutil.copy(settings_path(str(tmp_path / "plain.jsonl")), settings_path(str(tmp_path / "mixed.jsonl")))
    assert run("mixed.jsonl", "--resume", "--speculative-config", json.dumps(SPEC)) == 0
    assert _comparable(tmp_path / "mixed.jsonl") == plain


def test_replicas_counters_add_up_and_their_ratios_are_of_the_sums():
    from pacore.evaluate.summary import _sum_stats

    def session(drafts, drafted, accepted, emitted, per_pos):
        return {"engine_stats": {"spec_decode_num_drafts": drafts, "spec_decode_num_draft_tokens": drafted,
                                 "spec_decode_num_accepted_tokens": accepted, "spec_decode_num_emitted_tokens": emitted,
                                 "spec_decode_acceptance_rate": accepted / drafted,
                                 "spec_decode_mean_tokens_per_verify": emitted / drafts,
                                 "spec_decode_num_accepted_tokens_per_pos": per_pos}}
    one, two = session(10, 40, 20, 28, [9, 6, 4, 1]), session(30, 60, 6, 36, [5, 1, 0, 0])
    # self-drafting's adaptive depth: steps per depth, and the acceptance each replica estimates
    one["engine_stats"] |= {"spec_decode_depth_steps": {0: 5, 4: 10}, "spec_decode_acceptance_estimate": 0.5}
    two["engine_stats"] |= {"spec_decode_depth_steps": {0: 20, 2: 30}, "spec_decode_acceptance_estimate": 0.1}
    total = _sum_stats([one, two])
    assert (total["spec_decode_num_drafts"], total["spec_decode_num_draft_tokens"]) == (40, 100)
    assert total["spec_decode_num_accepted_tokens_per_pos"] == [14, 7, 4, 1]
    assert total["spec_decode_acceptance_rate"] == 26 / 100 and total["spec_decode_mean_tokens_per_verify"] == 64 / 40
    assert total["spec_decode_depth_steps"] == {0: 25, 2: 30, 4: 10}
    assert total["spec_decode_acceptance_estimate"] == pytest.approx(0.3)
