"""FP8 weights (LLM(quantization="fp8"), pre-quantized FP8 checkpoints): the projections in e4m3 and
everything else in the model's dtype, logits close to the unquantized model's, a block-scale checkpoint
loaded as stored, and what is refused named with its way out."""
import _triton_env  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.config import EngineConfig, ModelConfig
from engine.quant.fp8 import Fp8Linear, load_scale
from engine.quant.config import Fp8Config
from pacore_kernels.fp8_gemm import FP8, quantize_weight
from test_fp8_engine import step_logits, worst_relative_logit_error

# FP8 weights and per-token activations vs fp32, as a share of the largest |logit|, on the tiny random
# checkpoints (each projection within 2.5% rms of its weight; untrained weights amplify it): measured
# worst 0.17 (qwen3; weights alone 0.09); a wrong scale or a misplaced row is off by ~100%.
LOGIT_BOUND = 0.25
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = [128, 128]


def _fp8_layers(llm):
    return [m for m in llm.runner.model.modules() if isinstance(m, Fp8Linear)]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_quantized_at_load_the_projections_are_fp8_and_the_logits_close(kind, tiny_model_dir):
    model = str(tiny_model_dir(kind))
    base = LLM(model, skip_tokenizer_init=True)
    fp8 = LLM(model, skip_tokenizer_init=True, quantization="fp8")
    layers = _fp8_layers(fp8)
    assert len(layers) == 4 * 2  # q|k|v, o, gate|up, down in each of 2 layers
    assert all(m.weight.dtype == FP8 and m.weight_scale.shape == (m.out_features,) for m in layers)
    m = fp8.runner.model
    assert m.lm_head.weight.dtype == m.embed_tokens.weight.dtype == m.norm.weight.dtype == torch.float32
    assert worst_relative_logit_error(step_logits(base), step_logits(fp8)) < LOGIT_BOUND
    line = fp8.describe()
    assert "projections fp8_e4m3 (per-channel scales, quantized at load)" in line and "LM head float32" in line


def _write_block_checkpoint(src, dst):
    """A pre-quantized copy of ``src`` as Qwen3-8B-FP8 is stored: e4m3 projections, each with its fp32
    weight_scale_inv per 128 x 128 block, the rest as it was, and config.json's quantization_config."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for name in [n for n in tensors if n.split(".")[-2] in PROJECTIONS and n.endswith(".weight")]:
        tensors[name], tensors[name + "_scale_inv"] = quantize_weight(tensors[name].to(torch.bfloat16), tuple(BLOCK))
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": BLOCK}
    (dst / "config.json").write_text(json.dumps(cfg))
    return tensors


@pytest.fixture(scope="module")
def wide_qwen3(tmp_path_factory):
    """A tiny Qwen3 whose q, k, v, gate and up rows are multiples of 128 (as Qwen3-8B's), so each fused
    part starts on a scale block: hidden 128, 4 q and 4 kv heads of 32, intermediate 256."""
    import transformers
    folder = tmp_path_factory.mktemp("wide_qwen3")
    cfg = transformers.Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                                   max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=2,
                                   eos_token_id=1, pad_token_id=0)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def test_a_block_scale_checkpoint_loads_as_stored(wide_qwen3, tmp_path):
    stored = _write_block_checkpoint(wide_qwen3, tmp_path / "fp8")
    llm = LLM(str(tmp_path / "fp8"), skip_tokenizer_init=True)  # its own format, without being asked
    assert llm.config.quant == Fp8Config(block=(128, 128), prequantized=True)
    attn = llm.runner.model.layers[1].self_attn
    qkv = [f"model.layers.1.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj")]
    assert torch.equal(attn.qkv_proj.weight.view(torch.uint8), torch.cat([stored[n] for n in qkv]).view(torch.uint8))
    assert torch.equal(attn.qkv_proj.weight_scale, torch.cat([stored[n + "_scale_inv"] for n in qkv]))
    assert attn.qkv_proj.weight_scale.shape == (3, 1)
    assert "128x128 block scales, from the checkpoint" in llm.describe()
    base = LLM(str(wide_qwen3), skip_tokenizer_init=True)
    assert worst_relative_logit_error(step_logits(base), step_logits(llm)) < LOGIT_BOUND


def test_an_fp8_lm_head_is_refused_not_cast(wide_qwen3, tmp_path):
    stored = _write_block_checkpoint(wide_qwen3, tmp_path / "fp8")
    stored["lm_head.weight"], stored["lm_head.weight_scale_inv"] = quantize_weight(stored["lm_head.weight"], (128, 128))
    save_file(stored, str(tmp_path / "fp8" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lm_head.*is FP8.*keeps embeddings, norms and the LM head"):
        LLM(str(tmp_path / "fp8"), skip_tokenizer_init=True)


def _config_with(tiny_model_dir, tmp_path, quantization_config):
    src = tiny_model_dir("qwen3")
    cfg = json.loads((src / "config.json").read_text()) | {"quantization_config": quantization_config}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("qc,match", [
    ({"quant_method": "awq", "bits": 4}, "quant_method 'awq' is not supported.*quantization='fp8'"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt 'e5m2'.*only e4m3"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "activation_scheme 'static'.*dynamic"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "two positive integers"),
    ({"quant_method": "fp8", "weight_block_size": [128, 100]}, "power of two"),
])
def test_unsupported_checkpoint_formats_are_refused_naming_the_way_out(tiny_model_dir, tmp_path, qc, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_pretrained(_config_with(tiny_model_dir, tmp_path, qc))


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match=r"quantization must be one of \['fp8'\]"):
        EngineConfig(quantization="int8")


def test_block_scales_off_the_blocks_of_a_rank_are_refused():
    layer = Fp8Linear(128, 128, False, Fp8Config(block=(128, 128), prequantized=True))  # a rank's half of 256 in
    scale = torch.ones(1, 2)
    load_scale(layer, scale, None, (1, 0, 128), "o_proj")  # half the input columns: on a block boundary
    with pytest.raises(ValueError, match="tensor_parallel_size.*quantization='fp8'"):
        load_scale(layer, scale, None, (1, 0, 96), "o_proj")
    fused = Fp8Linear(64, 192, False, Fp8Config(block=(128, 128), prequantized=True))
    with pytest.raises(ValueError, match="multiple of 128 rows"):
        load_scale(fused, torch.ones(1, 1), (128, 64), None, "k_proj")


def test_tensor_parallel_shards_the_scales_with_their_weights(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    one = LLM(model, skip_tokenizer_init=True, quantization="fp8")
    two = LLM(model, skip_tokenizer_init=True, quantization="fp8", tensor_parallel_size=2)
    try:
        # rank 0 holds the first half of q, k, v (and gate, up) rows with their scales as quantized whole
        qkv1, qkv2 = one.runner.model.layers[0].self_attn.qkv_proj, two.runner.model.layers[0].self_attn.qkv_proj
        q, kv = 64, 32
        rows = [*range(q), *range(2 * q, 2 * q + kv), *range(2 * q + 2 * kv, 2 * q + 3 * kv)]
        assert torch.equal(qkv2.weight_scale, qkv1.weight_scale[rows])
        assert torch.equal(qkv2.weight.view(torch.uint8), qkv1.weight.view(torch.uint8)[rows])
        assert worst_relative_logit_error(step_logits(one), step_logits(two)) < LOGIT_BOUND
    finally:
        two.shutdown()


@pytest.mark.parametrize("command", ["run", "demo", "serve"])
def test_the_flag_reaches_the_engine(tmp_path, monkeypatch, command):
    import engine
    from pacore.cli import main
    if command == "serve":
        pytest.importorskip("fastapi")
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "p0", "messages": [{"role": "user", "content": "1+1?"}]}) + "\n")
    seen = {}

    def fake(*args, **kw):
        seen.update(kw)
        raise SystemExit(3)
    monkeypatch.setattr(engine, "LLM", fake)
    paths = {"run": ["--data", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl")],
             "demo": ["--out", str(tmp_path / "o.jsonl")], "serve": []}[command]
    with pytest.raises(SystemExit):
        main([command, *paths, "--quantization", "fp8"])
    assert seen["quantization"] == "fp8"


def test_the_device_model_charges_a_byte_per_projection_parameter(tmp_path):
    """PaCoRe-8B (Qwen3-8B's shape) on a modelled H200: the weights a step reads, and the KV cache the freed
    memory buys (docs/gpu.md#fp8-weights quotes these figures)."""
    from bench.rehearsal.shapes import model_folder
    from engine.device_model import DeviceParams, kv_tokens
    from engine.core.step_shape import ModelShape
    folder = model_folder("qwen3-8b", tmp_path)
    shapes = {q: ModelShape.from_config(ModelConfig.from_pretrained(folder, quantization=q), 2, 1) for q in (None, "fp8")}
    bf16, fp8 = shapes[None], shapes["fp8"]
    assert bf16.weight_bytes == 15_136_811_008 and fp8.weight_bytes == 8_196_646_912  # 15.1 -> 8.2 GB per step
    # the projections: a byte per parameter and an fp32 scale per output channel; the LM head stays bf16
    assert fp8.linear_weight_bytes == bf16.linear_params + 4 * 36 * (4096 + 2 * 1024 + 4096 + 2 * 12288 + 4096)
    assert fp8.weight_bytes - fp8.linear_weight_bytes == bf16.weight_bytes - bf16.linear_weight_bytes
    dev = DeviceParams()
    assert (kv_tokens(bf16, dev), kv_tokens(fp8, dev)) == (1_590_284, 1_684_416)  # FP8 KV, 0.9 of 141 GB
    two_byte_kv = [dataclasses.replace(s, kv_dtype_bytes=2) for s in (bf16, fp8)]
    assert [kv_tokens(s, dev) for s in two_byte_kv] == [795_142, 842_208]
