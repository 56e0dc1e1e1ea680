"""The rehearsal's vLLM baselines (issue 35): vLLM V1's defaults, its prefix cache hit in round 2, its
cascade only over a prefix the whole step shares; and the protocol's flags (--runs, --pool, --gpus)."""
import json

import pytest

from bench.rehearsal.__main__ import CONFIGS, main

TINY = ["--shape", "tiny", "--prompt-tokens", "64", "--mean-tokens", "300", "--conclusion-tokens", "20",
        "--kv-tokens", "20000", "--quiet"]


def test_the_baselines_carry_vllm_v1s_defaults():
    vllm = CONFIGS["vllm"]
    # n=K as K requests sharing full blocks through the automatic prefix cache; vLLM's H100/H200 server
    # budget and sequence limit; cascade only over a prefix common to the step, >= 256 tokens, >= 8 requests
    assert vllm["enable_fork"] is False and vllm["enable_prefix_caching"] is True
    assert (vllm["max_num_batched_tokens"], vllm["max_num_seqs"], vllm["gpu_memory_utilization"]) == (8192, 1024, 0.9)
    assert (vllm["cascade_scope"], vllm["cascade_min_group"], vllm["cascade_min_prefix"]) == ("batch", 8, 256)
    # no share of the step or of the seats per request (vLLM's long_prefill_token_threshold is 0 and
    # max_num_partial_prefills 1: a prompt takes what the budget leaves; the V1 scheduler has no seat cap)
    assert (vllm["long_prefill_token_threshold"], vllm["max_num_seqs_per_request"]) == (0, vllm["max_num_seqs"])
    assert CONFIGS["vllm-fp8"] == vllm | {"kv_cache_dtype": "fp8_e4m3"}
    ngram = CONFIGS["vllm-fp8+ngram"]
    assert ngram["kv_cache_dtype"] == "fp8_e4m3" and ngram["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 5,
        "lookup_siblings": False}
    # the old baseline is an ablation under its own name
    assert "vllm-style" not in CONFIGS and CONFIGS["no-sharing"] == {
        "enable_fork": False, "enable_prefix_caching": False, "cascade_attention": False}


def _round_stats(path):
    rec = json.loads(open(path).readline())
    return rec["rounds_stats"]


def test_vllm_hits_the_prefix_cache_in_round_2_and_no_sharing_does_not(tmp_path):
    out = tmp_path / "r"
    assert main([*TINY, "--preset", "high", "--problems", "1", "--config", "vllm", "--config", "no-sharing",
                 "--out", str(out)]) == 0
    (vllm, ablation), stats = ((json.loads((out / n / "report.json").read_text()) for n in ("vllm", "no-sharing")),
                               _round_stats(out / "vllm" / "results.jsonl"))
    # each round's K requests of one prompt, admitted in one step: all but the first find its full blocks
    # cached (round 1: 32 of a ~90-token prompt; round 2: 4 of a ~1,000-token prompt of references)
    shared = sum((r["k"] - 1) * 16 * ((r["prompt_tokens"] - 1) // 16) for r in stats[:2])
    assert stats[1]["k"] == 4 and stats[1]["prompt_tokens"] > 900
    assert ablation["prefill_tokens"] - vllm["prefill_tokens"] >= shared
    assert vllm["prefix_hit_tokens"] >= shared and ablation["prefix_hit_tokens"] == 0
    assert vllm["overall"]["tokens"] == ablation["overall"]["tokens"]


def _plan(scope: str, prompts: list[int]):
    """A scheduler whose running rows are one request each; rows with the same prompt id hold its 64
    prompt tokens in the same blocks (as the prefix cache leaves them), each 40 tokens past it."""
    from engine.core.block_manager import BlockManager
    from engine.sample.sampling_params import SamplingParams
    from engine.core.cascade import CascadePolicy
    from engine.core.scheduler import Scheduler
    from engine.core.sequence import Request, Sequence, Status
    from engine.core.stopping import StopChecker

    bm = BlockManager(256, 16)
    policy = CascadePolicy(None, 2, 16, 0, 0.0, scope)
    sched = Scheduler(bm, StopChecker(None, [], 1 << 20), 256, 4096, policy, enable_fork=False)
    owners = {}
    for i, p in enumerate(prompts):
        req = Request(f"r{i}", None, [p] * 64, SamplingParams(max_tokens=1000))
        seq = Sequence(req, 0, [p] * 64, 64)
        if p in owners:
            bm.fork(owners[p], seq, 64)
        else:
            bm.allocate(seq, 64)
            owners[p] = seq
        seq.num_computed = 64
        req.seqs.append(seq)
        seq.token_ids += [1000 + i] * 40
        bm.allocate(seq, 64 + 39)
        seq.num_computed = 64 + 39
        seq.status = Status.RUNNING
        sched.running.append(seq)
    return sched.schedule()


def test_batch_cascade_covers_only_a_prefix_every_row_of_the_step_shares():
    plan = _plan("batch", [1, 1, 1, 1])  # four requests of one prompt: one group, its 64 tokens
    assert plan.group_starts == [0, 4] and plan.group_prefix_lens == [64]
    assert not _plan("batch", [1, 1, 1, 2]).cascade  # one row of another prompt: no prefix common to the step
    assert not _plan("request", [1, 1, 1, 1]).cascade  # per request, a lone row shares nothing


def test_the_batch_cascade_is_charged_its_prefix_once(tmp_path):
    """A rehearsed step whose batch-wide group spans requests reads the shared prefix once."""
    from engine.rehearsal.runner import RehearsalRunner
    plan = _plan("batch", [1, 1, 1, 1])
    work = RehearsalRunner.work(type("R", (), {"_computed": {}, "ledger": type("L", (), {"recompute_tokens": 0})(),
                                               "shared_prefix": lambda self, req: 0})(), plan)
    (group,) = work.decodes
    assert group.cascade == group.shared == 64 and len(group.seq_lens) == 4


@pytest.mark.parametrize("extra, words", [
    (["--pool", "3"], ["--pool 3", "K=4", "--pool 4 or more"]),
    (["--gpus", "3"], ["--gpus 3", "2 problems", "use --gpus 2"]),
    (["--runs", "4", "--sample-runs", "5"], ["--sample-runs 5", "--sample-runs 4 or fewer"]),
    (["--gpus", "2", "--sample-problems", "2"], ["--sample-problems 2", "--sample-problems 1 or fewer"]),
    (["--replay", "x.jsonl", "--runs", "2"], ["--replay", "leave out --runs, --pool and --gpus"]),
])
def test_a_protocol_that_cannot_run_is_refused_naming_the_fix(tmp_path, capsys, extra, words):
    assert main([*TINY, "--preset", "low", "--problems", "2", *extra, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("flag", ["--runs", "--pool", "--gpus", "--sample-runs", "--sample-problems"])
def test_a_protocol_flag_that_is_not_a_positive_integer_is_refused(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as e:
        main([*TINY, flag, "0", "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_the_protocol_prints_hours_on_n_gpus_from_its_sample(tmp_path, capsys):
    out = tmp_path / "r"
    assert main([*TINY, "--preset", "high", "--problems", "3", "--runs", "16", "--pool", "128", "--gpus", "2",
                 "--config", "engine", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("3 problems x 16 runs, round 1 from a pool of 128 per problem, K=[32, 4, 1], on 2 GPUs: the slowest "
            "replica runs 2 problems; rehearsed: 2 problems x 8 runs, pool 64") in text
    assert "hours on 2 GPUs" in text and "assumes: modelled" in text
    rep = json.loads((out / "engine" / "report.json").read_text())
    e = rep["protocol"]
    # the sample's round tokens scale to the replica's: 2 problems x (128 pool + 16 x 4 + 16 x 1) trajectories
    for r, (full, done) in {1: (2 * 128, 2 * 64), 2: (2 * 64, 2 * 32), 3: (2 * 16, 2 * 8)}.items():
        assert e["rounds"][str(r)]["tokens"] == pytest.approx(rep["rounds"][str(r)]["tokens"] * full / done)
        assert e["rounds"][str(r)]["tokens_per_s"] == rep["rounds"][str(r)]["tokens_per_s"]
    assert e["hours"] * 3600 == pytest.approx(sum(x["seconds"] for x in e["rounds"].values()))
    # every round 2x the sample's (twice the runs and the pool of the same 2 problems): 2x its virtual time
    assert e["hours"] * 3600 == pytest.approx(2 * rep["overall"]["seconds"], rel=1e-3)


def test_a_protocol_rehearsed_in_full_is_its_own_virtual_time(tmp_path):
    out = tmp_path / "r"
    assert main([*TINY, "--preset", "high", "--problems", "1", "--runs", "2", "--pool", "32", "--config", "engine",
                 "--out", str(out)]) == 0
    rep = json.loads((out / "engine" / "report.json").read_text())
    assert rep["protocol"]["hours"] * 3600 == pytest.approx(rep["overall"]["seconds"])


def test_common_prefix_blocks_stops_at_the_first_table_that_differs():
    from engine.core.cascade import common_prefix_blocks
    assert common_prefix_blocks([[1, 2, 3, 4], [1, 2, 3, 4, 9], [1, 2, 3]], 4) == 3  # a shorter table bounds it
    assert common_prefix_blocks([[1, 2, 3, 4], [1, 2, 7, 4], [1, 2, 3, 4]], 4) == 2  # a differing block ends it
    assert common_prefix_blocks([[1, 2, 3, 4], [1, 2, 3, 4]], 2) == 2                # never past the limit
    assert common_prefix_blocks([[5, 2], [1, 2], [5, 2]], 2) == 0
    assert common_prefix_blocks([[1, 2, 3]], 3) == 3                                 # one table: all of it


def test_the_sample_pool_lets_each_sampled_run_draw_its_own_references():
    from bench.rehearsal.protocol import Protocol
    from pacore.evaluate.runs import draw

    def pool(pool, runs, sample_runs):
        return Protocol(30, runs, pool, 8, (32, 4, 1), (2, sample_runs)).sample_pool

    # scaled as the runs are (512 x 4 / 64 = 32 = K) it would be round 1's K: every run the same draw
    assert len({tuple(draw(32, 32, 0, "p0", run)) for run in range(4)}) == 1
    assert pool(512, 64, 4) == 64 and len({tuple(draw(64, 32, 0, "p0", run)) for run in range(4)}) == 4
    assert pool(512, 64, 16) == 128  # the scaled pool once it is larger
    assert pool(40, 64, 4) == 40 and pool(512, 64, 64) == 512  # never more than the protocol's pool
