"""Tensor parallelism on CPU: gloo, 2 (or 4) rank processes, against the same model unsplit."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from engine.config import ModelConfig
from engine.parallel.distributed import TPGroup, shard_of
from engine.llm import LLM, StepError
from engine.worker.loader import load_model
from engine.sample.sampling_params import SamplingParams
from engine.worker.tp_workers import WorkerDied
from tiny_models import make_tiny_model, runner_spy

PROMPTS = [[5, 6, 7, 8, 9] * 10, [3, 4] * 7, list(range(10, 60))]


def _run(folder, prompts, params, **options):
    """Greedy outputs and the logits of every sampled row, step by step."""
    logits = []
    with LLM(str(folder), num_kv_blocks=96, **options) as llm:
        with runner_spy(llm, lambda plan, out: logits.append(out)):
            outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.stats()
    return [[c.token_ids for c in o.outputs] for o in outs], logits, stats


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tp2_greedy_equals_tp1_with_a_fork_and_cascade(tmp_path, kind):
    folder = make_tiny_model(tmp_path / kind, kind)  # qwen2 has 1 KV head: both ranks hold a replica
    params = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(temperature=0, max_tokens=10),
              SamplingParams(temperature=0, max_tokens=12, n=8)]
    options = dict(cascade_attention=True, cascade_min_prefix=16, cascade_min_shared_tokens=16)
    one, logits1, _ = _run(folder, PROMPTS, params, **options)
    two, logits2, stats = _run(folder, PROMPTS, params, tensor_parallel_size=2, **options)
    assert two == one
    assert len(two[2]) == 8 and stats["cascade_decode_steps"] > 0
    assert stats["prefill_tokens"] < sum(map(len, PROMPTS)) + 8  # the forked prompt was prefilled once
    for a, b in zip(logits1, logits2, strict=True):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_tp4_replicated_kv_heads_and_a_padded_vocabulary(tmp_path):
    # 2 KV heads over 4 ranks (each rank holds one replica) and 250 = 4 x 63 - 2 vocabulary rows.
    folder = make_tiny_model(tmp_path / "m", "llama", vocab=250)
    params = SamplingParams(temperature=0, max_tokens=8)
    one, logits1, _ = _run(folder, PROMPTS[:2], params)
    four, logits4, _ = _run(folder, PROMPTS[:2], params, tensor_parallel_size=4)
    assert four == one
    assert logits4[0].shape[-1] == 250
    torch.testing.assert_close(logits4[0], logits1[0], rtol=1e-4, atol=1e-4)


def test_batch_invariant_mode_under_tp(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "qwen3")
    params = SamplingParams(temperature=0, max_tokens=8, n=3)
    one, _, _ = _run(folder, PROMPTS, params, batch_invariant=True)
    two, _, _ = _run(folder, PROMPTS, params, batch_invariant=True, tensor_parallel_size=2)
    assert two == one


def test_each_rank_loads_only_its_slices(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "qwen2", vocab=251)  # Qwen2: q/k/v biases; 1 KV head
    cfg = ModelConfig.from_pretrained(folder)
    full = load_model(cfg, torch.float32, torch.device("cpu"))
    rank1 = load_model(cfg, torch.float32, torch.device("cpu"), shard_of(cfg, 1, 2), TPGroup(1, 2))
    d, q, kv = cfg.head_dim, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    a, b = full.layers[0].self_attn, rank1.layers[0].self_attn
    assert b.qkv_proj.weight.shape == (q // 2 + 2 * kv, cfg.hidden_size)  # half the query heads, the KV head whole
    torch.testing.assert_close(b.qkv_proj.weight[:q // 2], a.qkv_proj.weight[q // 2:q])
    torch.testing.assert_close(b.qkv_proj.bias[q // 2:], a.qkv_proj.bias[q:])
    torch.testing.assert_close(b.o_proj.weight, a.o_proj.weight[:, q // 2:])
    ffn = cfg.intermediate_size // 2
    torch.testing.assert_close(rank1.layers[1].mlp.gate_up_proj.weight[:ffn], full.layers[1].mlp.gate_up_proj.weight[ffn:2 * ffn])
    torch.testing.assert_close(rank1.layers[1].mlp.down_proj.weight, full.layers[1].mlp.down_proj.weight[:, ffn:])
    rows = 126  # ceil(251 / 2); rank 1 holds 125 real rows and one of padding, zeroed
    assert rank1.lm_head.weight.shape == (rows, cfg.hidden_size)
    torch.testing.assert_close(rank1.lm_head.weight[:125], full.lm_head.weight[rows:])
    assert not rank1.lm_head.weight[125:].any()
    assert d == cfg.head_dim


def test_a_size_that_does_not_divide_is_refused_before_any_process_starts(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "qwen3")  # 4 heads, 2 KV heads, MLP 128
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not divide.*sizes that work: \[1, 2, 4\]"):
        LLM(str(folder), num_kv_blocks=32, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
        LLM(str(folder), num_kv_blocks=32, tensor_parallel_size=0)


def test_a_killed_worker_fails_the_step_clearly_and_keeps_the_tokens(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "qwen3")
    llm = LLM(str(folder), num_kv_blocks=64, tensor_parallel_size=2)
    worker = llm.runner.workers.procs[0]
    rid = llm.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=50, n=2))
    for _ in range(4):
        llm.step()
    os.kill(worker.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(StepError) as info:
        while True:  # the step in flight may still complete; the next one cannot
            llm.step()
    assert time.monotonic() - started < 10
    assert isinstance(info.value.cause, WorkerDied)
    assert "rank 1" in str(info.value.cause) and "killed by signal 9" in str(info.value.cause)
    tokens = [t for t, _ in info.value.partial[rid]]
    assert len(tokens) == 2 and all(len(t) >= 3 for t in tokens)  # what was generated is handed back
    assert not llm.has_unfinished() and llm.stats()["kv_blocks_used"] == 0
    with pytest.raises(WorkerDied, match="create a new one"):
        llm.add_request(PROMPTS[1], SamplingParams(max_tokens=4))
    llm.shutdown()


def test_shutdown_leaves_no_process_behind(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "llama")
    with LLM(str(folder), num_kv_blocks=32, tensor_parallel_size=2) as llm:
        procs = list(llm.runner.workers.procs)
        assert all(p.is_alive() for p in procs)
    assert not any(p.is_alive() for p in procs)
    llm.shutdown()  # idempotent
    # Dropping the engine without shutdown() stops its workers too.
    llm = LLM(str(folder), num_kv_blocks=32, tensor_parallel_size=2)
    procs = list(llm.runner.workers.procs)
    del llm
    import gc
    gc.collect()
    for p in procs:
        p.join(10)
    assert not any(p.is_alive() for p in procs)


def test_rank0_failing_alone_stops_the_group_instead_of_hanging(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "qwen3")
    llm = LLM(str(folder), num_kv_blocks=64, tensor_parallel_size=2)
    procs = list(llm.runner.workers.procs)
    rid = llm.add_request(PROMPTS[0], SamplingParams(temperature=0, max_tokens=20))
    llm.step()

    def broken(inputs):  # rank 0 fails before its first collective; rank 1 is already in its forward
        raise MemoryError("injected")
    llm.runner.execute = broken
    with pytest.raises(StepError) as info:
        llm.step()
    assert isinstance(info.value.cause, WorkerDied) and "rank 0 failed" in str(info.value.cause)
    assert rid in info.value.partial
    for p in procs:
        p.join(10)
    assert not any(p.is_alive() for p in procs)


_ORPHAN_SCRIPT = """
import sys, time
from engine.llm import LLM
llm = LLM(sys.argv[1], num_kv_blocks=32, tensor_parallel_size=2)
print(" ".join(str(p.pid) for p in llm.runner.workers.procs), flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited; only its reaping is left
    except FileNotFoundError:
        return False


def test_workers_exit_when_rank0_is_killed(tmp_path):
    import subprocess
    import sys
    folder = make_tiny_model(tmp_path / "m", "llama")
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT, str(folder)], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids and all(_running(p) for p in pids)
        proc.kill()  # SIGKILL: no atexit, no finalizer; the workers see their pipe close
        proc.wait()
        deadline = time.monotonic() + 15
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(p) for p in pids)
    finally:
        proc.kill()


def test_tp2_under_preemption_and_reused_table_rows(tmp_path):
    # A cache too small for everything: sequences are preempted and recomputed and their block-table
    # rows reused; the workers' copies of the buffer must follow every change.
    folder = make_tiny_model(tmp_path / "m", "qwen2")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (40 + 7 * i,), generator=gen).tolist() for i in range(5)]
    params = [SamplingParams(n=1 + i % 3, temperature=0, max_tokens=48, ignore_eos=True) for i in range(5)]
    with LLM(str(folder), num_kv_blocks=512) as big:
        expected = [[c.token_ids for c in o.outputs] for o in big.generate(prompts, params, use_tqdm=False)]
    with LLM(str(folder), num_kv_blocks=14, tensor_parallel_size=2, max_num_seqs=4) as small:
        got = [[c.token_ids for c in o.outputs] for o in small.generate(prompts, params, use_tqdm=False)]
        assert small.stats()["preemptions"] > 0
    assert got == expected


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_pacore_run_refuses_a_size_that_does_not_divide_before_anything_runs(tmp_path, capsys, replicas):
    import json

    from pacore.cli import main
    folder = make_tiny_model(tmp_path / "m", "qwen3")
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "1+1?"}]}) + "\n")
    out = tmp_path / "r.jsonl"
    rc = main(["run", "--model", str(folder), "--data", str(data), "--out", str(out), "--max-tokens", "8",
               "--tensor-parallel", "3", "--data-parallel", replicas])
    assert rc == 2
    assert "tensor_parallel_size=3 does not divide" in capsys.readouterr().err
    assert not out.exists()


def test_tp2_logprobs_equal_tp1(tmp_path):
    """Scored prompt rows go through the vocabulary-split LM head on every rank (its gather pairs up)."""
    folder = make_tiny_model(tmp_path / "qwen3", "qwen3")
    params = SamplingParams(n=2, temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2)
    outs = []
    for tp in (1, 2):
        with LLM(str(folder), num_kv_blocks=96, max_num_batched_tokens=32, tensor_parallel_size=tp) as llm:
            outs.append(llm.generate([PROMPTS[2]], params, use_tqdm=False)[0])
    one, two = outs
    assert [c.token_ids for c in two.outputs] == [c.token_ids for c in one.outputs]
    for a, b in zip(one.outputs, two.outputs):
        assert a.logprobs.token_ids == b.logprobs.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs.logprobs, b.logprobs.logprobs)) < 1e-5
    assert two.prompt_logprobs[0] is None and len(two.prompt_logprobs) == len(PROMPTS[2])
    for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:]):
        assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 1e-5 for t in a)


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


@pytest.mark.parametrize("spec,options", [
    (NGRAM, dict(cascade_attention=True, cascade_min_prefix=16, cascade_min_shared_tokens=16)),
    (NGRAM, dict(num_kv_blocks=12, max_num_seqs=8)),  # preemption, reused table rows, trimmed and regrown
    # the model drafts over a window of its own KV: every rank runs the draft steps
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 4, "policy": "fixed"}, dict()),
    # sparse: every rank keeps its own KV heads' key bounds and chooses its blocks by them
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 4, "selected": 8, "policy": "fixed"},
     dict(block_size=4, num_kv_blocks=384)),
    # layer skipping: every rank runs the draft's one layer (the second), its all-reduces paired
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 4, "policy": "fixed",
      "draft_layers": [1]}, dict()),
    # verify-guided: every rank keeps the importance its own heads' verify attention gave each block
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 4, "selected": 8, "policy": "fixed",
      "selection": "verify"}, dict(block_size=4, num_kv_blocks=384)),
], ids=["ngram-cascade", "ngram-preempt", "self_window", "self_window-sparse", "self_window-layers",
        "self_window-verify"])
def test_tp2_speculative_greedy_equals_tp1_without(tmp_path, spec, options):
    # Drafts are chosen on rank 0 (the plan is made there); the workers get the verify rows' packed
    # queries (decode_cu_seqlens_q) in the step's inputs and the block-table entries a trim rewrites.
    folder = make_tiny_model(tmp_path / "m", "qwen3")
    params = SamplingParams(n=4, temperature=0, max_tokens=32, ignore_eos=True)
    with LLM(str(folder), num_kv_blocks=256) as plain:
        expected = [[c.token_ids for c in o.outputs] for o in plain.generate(PROMPTS, params, use_tqdm=False)]
    with LLM(str(folder), **{"num_kv_blocks": 96, **options}, tensor_parallel_size=2,
             speculative_config=spec) as llm:
        got = [[c.token_ids for c in o.outputs] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        stats = llm.stats()
    assert got == expected
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]  # both paths
    assert stats["kv_blocks_used"] == 0
    if "cascade_attention" in options:
        assert stats["cascade_decode_steps"] > 0
    if "max_num_seqs" in options:
        assert stats["preemptions"] > 0


def test_an_nccl_group_binds_its_device_at_init(monkeypatch):
    """The NCCL communicator is created when the group is, on the rank's device, not lazily by the first
    collective (which could otherwise fall inside a CUDA-graph capture). Faked: no GPU, no NCCL here."""
    import engine.parallel.distributed as d
    made = []

    class FakeNCCL:
        class Options:
            _timeout = None

        def __init__(self, store, rank, size, options):
            self.connected = []
            made.append(self)

        def eager_connect_single_device(self, device):
            self.connected.append(device)

    monkeypatch.setattr(d.dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    monkeypatch.setattr(d.dist, "TCPStore", lambda *a, **k: object())
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    tp = d.connect(1234, 1, 2, torch.device("cuda", 1))
    assert tp.pg is made[0] and made[0].connected == [torch.device("cuda", 1)]


@pytest.mark.parametrize("value, refused", [("1", True), ("true", True), ("0", False), ("", False)])
def test_graph_capture_refuses_nccl_blocking_wait(monkeypatch, value, refused):
    from engine.parallel.distributed import check_graph_capture_env
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", value)
    if refused:
        with pytest.raises(RuntimeError, match="enforce_eager=True"):
            check_graph_capture_env()
    else:
        check_graph_capture_env()
