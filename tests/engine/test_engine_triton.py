"""A whole generation through the Triton kernels (interpreter on CPU) equals the torch path."""
import _triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from engine import LLM, SamplingParams

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
