"""The CUDA-graph decode path's static buffers and padding, emulated on CPU (same inputs, eager call)."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.cuda_graphs import bucket_sizes


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
    assert captured == {(n, c) for n in (1, 2, 4, 5) for c in ((False, True) if cascade else (False,))} - {(1, True)}
    calls = []
    real_run = llm.runner.graphs.run
    llm.runner.graphs.run = lambda *a: calls.append(a[0].shape[0]) or real_run(*a)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [[o.token_ids for o in r.outputs] for r in got] == [[o.token_ids for o in r.outputs] for r in eager]
    assert calls and max(calls) <= 5          # 6 trajectories: the 6-row steps ran eagerly
    assert any(b not in (1, 2, 4, 5) for b in calls)  # some batches were padded up to a bucket
    llm.shutdown()
