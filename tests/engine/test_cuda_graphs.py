"""The CUDA-graph decode path's static buffers and padding, emulated on CPU (same inputs, eager call)."""
import gc
import weakref

import pytest
import torch

from engine import LLM, SamplingParams
from engine.worker.cuda_graphs import bucket_sizes


def test_bucket_sizes():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(40) == [1, 2, 4, 8, 16, 32, 40]


@pytest.mark.parametrize("cascade, tp", [(True, 1), (False, 1), (True, 2)])
def test_graph_buffers_give_eager_tokens(tiny_model_dir, cascade, tp):
    model = str(tiny_model_dir("qwen3"))
    prompts = [torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (35, 50, 7)]
    params = [SamplingParams(n=k, temperature=0.9, seed=k, max_tokens=m, ignore_eos=True)
              for k, m in ((3, 12), (2, 20), (1, 30))]
    kw = dict(num_kv_blocks=128, cascade_attention=cascade, cascade_min_prefix=16)
    eager = LLM(model, **kw).generate(prompts, params, use_tqdm=False)
    llm = LLM(model, tensor_parallel_size=tp, **kw)
    llm.runner.capture_decode_graphs(5, emulate=True)  # with tp=2, on both ranks: replays pair up
    captured = set(llm.runner.graphs.graphs)
    # cascade needs >= 2 decodes: no 1-row cascade graph is captured (it could never be replayed)
    assert captured == {(n, 1, c) for n in (1, 2, 4, 5) for c in ((False, True) if cascade else (False,))} - {(1, 1, True)}
    calls = []
    real_run = llm.runner.graphs.run
    llm.runner.graphs.run = lambda *a: calls.append(a[0].shape[0]) or real_run(*a)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [[o.token_ids for o in r.outputs] for r in got] == [[o.token_ids for o in r.outputs] for r in eager]
    assert calls and max(calls) <= 5          # 6 trajectories: the 6-row steps ran eagerly
    assert any(b not in (1, 2, 4, 5) for b in calls)  # some batches were padded up to a bucket
    llm.shutdown()


@pytest.mark.parametrize("cascade", [False, True])
def test_verify_step_graphs_give_eager_tokens(tiny_model_dir, cascade):
    """Speculative decoding: verify steps replay graphs of Q = k + 1 query slots per row, rows with
    fewer drafts (and padding rows, with none) leaving slots unused."""
    model = str(tiny_model_dir("qwen3"))
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 7]
    params = SamplingParams(n=3, temperature=0, max_tokens=30, ignore_eos=True)
    kw = dict(num_kv_blocks=128, cascade_attention=cascade, cascade_min_prefix=16, speculative_config=spec)
    eager = LLM(model, **kw).generate(prompts, params, use_tqdm=False)
    llm = LLM(model, **kw)
    llm.runner.capture_decode_graphs(8, emulate=True)
    assert {q for _, q, _ in llm.runner.graphs.graphs} == {1, 4}
    calls = []
    real_run = llm.runner.graphs.run
    llm.runner.graphs.run = lambda ids, pos, meta: calls.append((meta.decode_seq_lens.shape[0], ids.shape[0])) \
        or real_run(ids, pos, meta)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [[o.token_ids for o in r.outputs] for r in got] == [[o.token_ids for o in r.outputs] for r in eager]
    verify = [(b, t) for b, t in calls if t > b]
    assert verify and any(b not in (1, 2, 4, 8) for b, _ in verify)  # padded rows
    assert any(t < 4 * b for b, t in verify)                           # ragged: unused query slots
    assert llm.stats()["spec_decode_num_accepted_tokens"] > 0


def _with_graphs(model: str, **options):
    llm = LLM(model, num_kv_blocks=64, cascade_attention=True, cascade_min_prefix=16, **options)
    llm.runner.capture_decode_graphs(4, emulate=True)
    llm.generate([list(range(3, 40))], SamplingParams(n=3, max_tokens=6, ignore_eos=True), use_tqdm=False)
    return llm


@pytest.mark.parametrize("spec", [None, dict(method="self_window", num_speculative_tokens=2, window=8, sink=4, policy="fixed")])
def test_dropping_an_llm_with_graphs_frees_its_runner_at_once(tiny_model_dir, spec):
    # Without a gc pass: a notebook's `del llm; llm = LLM(...)` must not keep the old KV cache and weights
    # (with speculative decoding too: verify and draft graphs).
    llm = _with_graphs(str(tiny_model_dir("qwen3")), speculative_config=spec)
    runner, cache = weakref.ref(llm.runner), weakref.ref(llm.runner.kv_cache)
    gc.collect()
    gc.disable()
    try:
        del llm
        assert runner() is None and cache() is None
    finally:
        gc.enable()


def test_shutdown_releases_the_cache_graphs_and_weights(tiny_model_dir):
    with _with_graphs(str(tiny_model_dir("qwen3"))) as llm:
        cache, weight = weakref.ref(llm.runner.kv_cache), weakref.ref(llm.runner.model.embed_tokens.weight)
        graphs = weakref.ref(llm.runner.graphs)
    gc.disable()  # released by shutdown itself, while `llm` is still held
    try:
        assert cache() is None and weight() is None and graphs() is None
    finally:
        gc.enable()
    assert llm.stats()["kv_blocks_total"] == 64  # the bookkeeping stays readable
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.shutdown()  # idempotent


def test_kv_sizing_counts_memory_torch_keeps_cached_as_free(monkeypatch):
    """An earlier engine's memory, freed but still cached by torch's allocator, is room for the next
    cache (the allocator returns it to the device when an allocation needs it). Faked: no GPU here."""
    from types import SimpleNamespace

    from engine.worker.model_runner import ModelRunner
    gb = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * gb, 100 * gb))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 50 * gb)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 20 * gb)
    runner = SimpleNamespace(device=torch.device("cuda", 0))
    assert ModelRunner.free_kv_bytes(runner, 0.9) == (10 + 30 - 10) * gb
