"""compressed-tensors FP8-dynamic checkpoints (llm-compressor's releases): a tiny one written as they are
stored loads bit for bit (e4m3 weights, per-channel weight_scale [out, 1] in bf16), the modules its
`ignore` names stay in the model's dtype with their weights as stored, and what is not FP8-dynamic is
refused naming the key."""
import _triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.config import ModelConfig
from engine.quant.config import Fp8Config
from engine.quant.fp8 import Fp8Linear
from pacore_kernels.fp8_gemm import FP8, quantize_weight
from test_fp8_engine import step_logits, worst_relative_logit_error
from test_fp8_weights import LOGIT_BOUND, PROJECTIONS

IGNORED = "model.layers.1.mlp.down_proj"
SCHEME = {"weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False,
                      "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                      "observer_kwargs": {}},
          "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                "dynamic": True, "group_size": None, "block_structure": None, "actorder": None,
                                "observer": None, "observer_kwargs": {}},
          "output_activations": None, "targets": ["Linear"]}
QUANTIZATION_CONFIG = {"quant_method": "compressed-tensors", "format": "float-quantized",
                       "quantization_status": "compressed", "config_groups": {"group_0": SCHEME},
                       "ignore": ["lm_head", IGNORED], "kv_cache_scheme": None, "global_compression_ratio": 1.5}


def _write(src, dst, qc=QUANTIZATION_CONFIG):
    """A compressed-tensors copy of ``src``: each projection but IGNORED in e4m3 with its bf16 weight_scale
    [out, 1], the rest (IGNORED, embeddings, norms, LM head) as it was, and config.json's quantization_config."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for name in [n for n in tensors if n.split(".")[-2] in PROJECTIONS and n.endswith(".weight")]:
        if not name.startswith(IGNORED):
            q, scale = quantize_weight(tensors[name].float())
            tensors[name], tensors[name + "_scale"] = q, scale.to(torch.bfloat16)[:, None]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text()) | {"quantization_config": qc}
    (dst / "config.json").write_text(json.dumps(cfg))
    return tensors


def test_a_compressed_tensors_checkpoint_loads_bit_for_bit(tiny_model_dir, tmp_path):
    src = tiny_model_dir("qwen3")
    stored = _write(src, tmp_path / "fp8-dynamic")
    llm = LLM(str(tmp_path / "fp8-dynamic"), skip_tokenizer_init=True)  # its own format, without being asked
    assert llm.config.quant == Fp8Config(prequantized=True, ignore=("lm_head", IGNORED), method="compressed-tensors")
    model = llm.runner.model
    for i, layer in enumerate(model.layers):
        hf = f"model.layers.{i}."
        for fused, parts in ((layer.self_attn.qkv_proj, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                             (layer.self_attn.o_proj, ("self_attn.o_proj",)),
                             (layer.mlp.gate_up_proj, ("mlp.gate_proj", "mlp.up_proj")),
                             (layer.mlp.down_proj, ("mlp.down_proj",))):
            weights = torch.cat([stored[hf + p + ".weight"] for p in parts])
            if hf + parts[0] == IGNORED:  # left in the model's dtype, as stored
                assert type(fused) is torch.nn.Linear and torch.equal(fused.weight, weights)
                continue
            assert isinstance(fused, Fp8Linear) and fused.weight.dtype == FP8
            assert torch.equal(fused.weight.view(torch.uint8), weights.view(torch.uint8))
            scales = torch.cat([stored[hf + p + ".weight_scale"] for p in parts])
            assert torch.equal(fused.weight_scale, scales.float().reshape(-1))  # bf16 [out, 1] read exactly
    assert torch.equal(model.lm_head.weight, stored["lm_head.weight"])
    assert "per-channel scales, from the compressed-tensors checkpoint" in llm.describe()
    base = LLM(str(src), skip_tokenizer_init=True)
    assert worst_relative_logit_error(step_logits(base), step_logits(llm)) < LOGIT_BOUND


def _with(change):
    qc = copy.deepcopy(QUANTIZATION_CONFIG)
    change(qc, qc["config_groups"]["group_0"])
    return qc


@pytest.mark.parametrize("change,match", [
    (lambda qc, g: g["weights"].update(type="int"), r"weights.type is 'int'"),
    (lambda qc, g: g["input_activations"].update(dynamic=False), r"input_activations.dynamic is False"),
    (lambda qc, g: g.update(input_activations=None), "no input_activations"),
    (lambda qc, g: g["weights"].update(strategy="group", group_size=128), r"weights.group_size is 128"),
    (lambda qc, g: qc.update(format="pack-quantized"), "format 'pack-quantized'"),
    (lambda qc, g: qc["config_groups"].update(group_1=dict(g, targets=["re:.*down_proj"])), "one scheme"),
])
def test_what_is_not_fp8_dynamic_is_refused_naming_the_key(tiny_model_dir, tmp_path, change, match):
    src = tiny_model_dir("qwen3")
    cfg = json.loads((src / "config.json").read_text()) | {"quantization_config": _with(change)}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_pretrained(tmp_path)


def test_ignore_entries_match_names_suffixes_and_patterns():
    quant = Fp8Config(ignore=("lm_head", "re:.*layers\\.0\\.mlp\\.", "model.layers.2.self_attn"))
    assert not quant.quantizes("lm_head") and not quant.quantizes("model.layers.0.mlp.down_proj")
    assert not quant.quantizes("model.layers.2.self_attn.q_proj") and quant.quantizes("model.layers.1.mlp.down_proj")
    assert quant.quantizes("model.layers.10.mlp.up_proj")
    # vLLM's fp8 method names them ignored_layers, transformers' modules_to_not_convert
    from engine.quant.config import checkpoint_quantization
    for key in ("ignored_layers", "modules_to_not_convert"):
        cfg = checkpoint_quantization({"quantization_config": {"quant_method": "fp8", key: ["lm_head"]}}, "config.json")
        assert cfg.ignore == ("lm_head",)


def test_a_fused_projection_partly_ignored_is_refused(tiny_model_dir, tmp_path):
    qc = dict(QUANTIZATION_CONFIG, ignore=["model.layers.0.self_attn.k_proj"])
    _write(tiny_model_dir("qwen3"), tmp_path / "ck", qc)
    with pytest.raises(ValueError, match=r"leaves \['model.layers.0.self_attn.k_proj'\] unquantized but not"):
        LLM(str(tmp_path / "ck"), skip_tokenizer_init=True)


def test_the_startup_line_says_fp8_only_for_the_projections_quantized(tiny_model_dir, tmp_path):
    """Issue 52, item 3: the `ignore` list's down_proj of layer 1 (and lm_head) are named as left in the dtype,
    and the bytes are those of the model as built."""
    from dataclasses import replace

    from engine.quant.fp8 import describe_weights, weight_bytes

    _write(tiny_model_dir("qwen3"), tmp_path / "fp8-dynamic")
    llm = LLM(str(tmp_path / "fp8-dynamic"), skip_tokenizer_init=True, num_kv_blocks=8)
    fp8, other = weight_bytes(llm.runner.model)
    assert (f"weights {(fp8 + other) / 1e6:.1f} MB: projections fp8_e4m3 (per-channel scales, from the "
            f"compressed-tensors checkpoint) {fp8 / 1e6:.1f} MB for q,k,v,o,gate,up in every layer, down in 1 of 2 "
            f"layers; the other projections, embeddings, norms and LM head float32") in llm.describe()
    cfg = llm.config
    attention_only = replace(cfg, quant=replace(cfg.quant, ignore=("lm_head", "re:.*mlp")))
    assert "0.1 MB for q,k,v,o in every layer; the other projections" in describe_weights(attention_only, torch.float32)
    nothing = replace(cfg, quant=replace(cfg.quant, ignore=("re:model",)))
    assert describe_weights(nothing, torch.float32) == ("weights float32 0.5 MB (the checkpoint's quantization_config "
                                                        "leaves every projection unquantized)")
