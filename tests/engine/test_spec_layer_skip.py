"""Layer-skipping self-drafts (speculative_config ``draft_layers``): which layers a count keeps, the config
refused naming the key, and a draft step that really runs only its layers. That the output stays exact
is pinned with the other self-drafting policies (test_spec_self_window.py's ``layers`` cases, the TP=2
and Triton-graph cases)."""
import json
import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from engine.spec.layer_skip import kept_layers
from test_spec_decode import PROMPTS
from test_spec_self_window import SW


def test_a_count_keeps_the_first_and_last_halves():
    assert kept_layers(None, 30) is None
    assert kept_layers(30, 30) is None and kept_layers(tuple(range(30)), 30) is None  # every layer: the plain path
    assert kept_layers(22, 30) == tuple(range(11)) + tuple(range(19, 30))  # layers 11-18 skipped
    assert kept_layers(15, 36) == tuple(range(8)) + tuple(range(29, 36))
    assert kept_layers(1, 30) == (0,) and kept_layers(2, 30) == (0, 29)
    assert kept_layers((3, 7), 30) == (3, 7)


@pytest.mark.parametrize("bad,match", [
    ({"method": "ngram", "draft_layers": 1}, "apply to method 'self_window'"),
    ({"method": "self_window", "draft_layers": 0}, "draft_layers=0 keeps no layer"),
    ({"method": "self_window", "draft_layers": []}, "draft_layers must be an integer or a non-empty list"),
    ({"method": "self_window", "draft_layers": True}, "draft_layers must be"),
    ({"method": "self_window", "draft_layers": [1, 1]}, r"names layer\(s\) \[1\] twice"),
    ({"method": "self_window", "draft_layers": [0, -1]}, "draft_layers .* negative"),
    ({"method": "self_window", "draft_layers": 3}, "draft_layers=3 keeps more layers than the model's 2"),
    ({"method": "self_window", "draft_layers": [0, 2]}, r"names layer 2, but the model's layers are 0\.\.1"),
])
def test_bad_draft_layers_are_refused_naming_the_key(tiny_model_dir, bad, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_model_dir("qwen3")), speculative_config=bad)


def _first_layer_only(src, dst):
    """The checkpoint cut to its first layer: the same embedding, layer 0, final norm and LM head."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        save_file({k: v for k, v in load_file(f).items() if ".layers.1." not in k}, f, metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cut = {"num_hidden_layers": 1} | ({"layer_types": cfg["layer_types"][:1]} if "layer_types" in cfg else {})
    (dst / "config.json").write_text(json.dumps(cfg | cut))
    return dst


def test_a_draft_step_runs_only_its_layers_and_drafts_what_the_cut_model_decodes(tiny_model_dir, tmp_path):
    """draft_layers [0] of 2, a window over the whole context: every draft step calls layer 0 and never layer
    1 (the verify steps call both), and each draft round's tokens are the greedy continuation of the row by
    the model cut to its first layer (its layer-0 KV is the full model's: kept layers that are a prefix see
    what the cut model would have written)."""
    model = tiny_model_dir("qwen3")
    llm = LLM(str(model), skip_tokenizer_init=True, speculative_config=dict(SW, sink=0, window=4096, draft_layers=[0]))
    calls: list[int] = []
    for i, layer in enumerate(llm.runner.model.layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: calls.append(i))
    rounds: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # (seq, position) -> (prefix, drafts)
    run_draft = llm.runner.run_draft

    def spy_draft(seqs, tokens, offset, *args, **kwargs):
        before = len(calls)
        logits = run_draft(seqs, tokens, offset, *args, **kwargs)
        assert calls[before:] == [0]
        for s, row in zip(seqs, logits):
            prefix, drafts = rounds.setdefault((s.seq_id, s.num_computed), (list(s.token_ids), []))
            drafts.append(int(row.argmax()))
        return logits
    llm.runner.run_draft = spy_draft
    llm.generate(PROMPTS, SamplingParams(n=2, temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert calls.count(1) > 0 and len(rounds) > 20
    cut = LLM(str(_first_layer_only(model, tmp_path / "cut")), skip_tokenizer_init=True)
    prefixes, drafts = zip(*rounds.values())
    outs = cut.generate([list(p) for p in prefixes],
                        [SamplingParams(temperature=0, max_tokens=len(d), ignore_eos=True) for d in drafts],
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == list(drafts)
    st = llm.stats()
    assert 0 < st["spec_decode_num_accepted_tokens"] < st["spec_decode_num_draft_tokens"]


def test_the_adaptive_policy_charges_a_layer_skipping_draft_for_its_layers(tiny_model_dir):
    """The modelled draft step reads the kept layers' weights only: cheaper than a full-depth one, the
    verify pass unchanged."""
    from engine.config import ModelConfig
    from engine.spec.config import SpeculativeConfig
    from engine.spec.policy import adaptive_policy
    cfg = ModelConfig.from_pretrained(str(tiny_model_dir("qwen3")))
    costs = {}
    for layers in (None, 1):
        spec = SpeculativeConfig.from_dict({"method": "self_window", "draft_layers": layers} if layers else
                                           {"method": "self_window"})
        costs[layers] = adaptive_policy(spec, cfg, torch.bfloat16, torch.bfloat16).step_seconds([4096] * 8, 4)
    (draft_full, verify_full), (draft_half, verify_half) = costs[None], costs[1]
    assert draft_half < draft_full and verify_half == verify_full
