"""A whole generation through the Triton kernels (interpreter on CPU) equals the torch path."""
import _triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from engine import LLM, SamplingParams
from test_spec_self_window import spy_selection

pytest.importorskip("triton")


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_triton_backend_same_tokens_as_torch(kind, tiny_model_dir):
    prompts = [torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (21, 40)]
    params = SamplingParams(n=3, temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tiny_model_dir(kind)), num_kv_blocks=64, max_num_batched_tokens=32,
                  attention_backend=backend, cascade_attention=True, device="cpu")
        res = llm.generate(prompts, params, use_tqdm=False)
        outs[backend] = [[o.token_ids for o in r.outputs] for r in res]
        assert llm.stats()["cascade_decode_steps"] > 0
    assert outs["triton"] == outs["torch"]


@pytest.mark.parametrize("spec,block_size", [
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}, 16),
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 2, "policy": "fixed"}, 16),
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 2, "selected": 4, "policy": "fixed"}, 4),
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 2, "policy": "fixed",
      "draft_layers": [1]}, 16),
    ({"method": "self_window", "num_speculative_tokens": 3, "window": 8, "sink": 2, "selected": 4, "policy": "fixed",
      "selection": "verify"}, 4),
], ids=["ngram", "self_window", "self_window-sparse", "self_window-layers", "self_window-verify"])
def test_speculative_triton_graphs_give_the_torch_tokens(tiny_model_dir, spec, block_size):
    """Verify and draft steps through the Triton kernels, replayed from (emulated) graph buffers with cascade
    on: ragged rows and a bucket's padding queries past the last row's (a cascade plan once failed there);
    sparse draft steps choose their blocks inside the graph (padding rows read their one token), by key bounds
    or by the importance the verify graphs emitted."""
    prompts = [[5, 6, 7, 8] * 5, [9, 10, 11] * 6]
    params = SamplingParams(n=3, temperature=0, max_tokens=7, ignore_eos=True)
    kw = dict(num_kv_blocks=64 * 16 // block_size, cascade_attention=True, cascade_min_prefix=16, device="cpu",
              block_size=block_size)
    torch_out = LLM(str(tiny_model_dir("qwen3")), attention_backend="torch", **kw).generate(prompts, params,
                                                                                            use_tqdm=False)
    llm = LLM(str(tiny_model_dir("qwen3")), attention_backend="triton", speculative_config=spec, **kw)
    llm.runner.capture_decode_graphs(8, emulate=True)
    cut = spy_selection(llm) if spec.get("selected") else [1]
    assert llm.runner.window_ops.name == "triton"
    calls = [0, 0]  # per layer: a layer-skipping draft step (from its graph) runs layer 1 alone
    for i, layer in enumerate(llm.runner.model.layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: calls.__setitem__(i, calls[i] + 1))
    out = llm.generate(prompts, params, use_tqdm=False)
    assert (calls[1] > calls[0]) == ("draft_layers" in spec)
    assert [[o.token_ids for o in r.outputs] for r in out] == [[o.token_ids for o in r.outputs] for r in torch_out]
    st = llm.stats()
    assert st["spec_decode_num_draft_tokens"] > 0 and st["cascade_decode_steps"] > 0 and sum(cut) > 0
