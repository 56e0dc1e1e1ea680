"""Model shapes a rehearsal can take: a config.json only (no weights), with SmolLM2's tokenizer.

The rehearsal allocates no weights, so a shape is its Hugging Face config. Its text goes through the
embedded SmolLM2 tokenizer (its 49,152 ids lie inside every vocabulary below; EOS is its id 2).
"""
from __future__ import annotations

import json
from pathlib import Path

# Qwen3-8B's published config, which PaCoRe-8B keeps, with the context the paper runs at (YaRN scale 2.0 to
# 131,072: bench/gpu/checkpoint.py PACORE_YARN, docs/pacore-runs.md).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
    "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 65536, "attention_factor": 1.0},
    "rope_theta": 1000000.0,
}
# Meta-Llama-3-8B's published config (the calibration's published Llama measurements ran it).
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "torch_dtype": "bfloat16", "rope_theta": 500000.0,
}
# A small Qwen3 for tests: the same code paths at a size a test steps through in seconds.
TINY = QWEN3_8B | {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152, "max_position_embeddings": 8192,
                   "rope_scaling": None}
SHAPES = {"qwen3-8b": QWEN3_8B, "llama3-8b": LLAMA3_8B, "tiny": TINY}


def model_folder(shape: str, folder: Path) -> Path:
    """A folder with the shape's config.json and the embedded tokenizer in ``folder/tokenizer``."""
    from engine.default_model import resolve_model
    smol = Path(resolve_model(None))
    out = Path(folder) / shape
    (out / "tokenizer").mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in SHAPES[shape].items() if v is not None} | {"eos_token_id": 2, "bos_token_id": 1}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "chat_template.jinja"):
        if (smol / name).is_file():
            (out / "tokenizer" / name).write_bytes((smol / name).read_bytes())
    tok_cfg = json.loads((smol / "tokenizer_config.json").read_text())
    tok_cfg["model_max_length"] = cfg["max_position_embeddings"]  # the shape's context, not SmolLM2's 8k
    (out / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return out
