"""How long a context the engine may serve: the model's, as vLLM derives it, unless told otherwise."""
from __future__ import annotations

import os

from engine.config import ModelConfig


def check_max_model_len(cfg: ModelConfig, max_model_len: int | None, environ=None) -> int:
    """The context to serve: ``max_model_len`` or the model's. Beyond the model's (its
    max_position_embeddings, or what its RoPE scaling derives as vLLM derives it: for YaRN
    original_max_position_embeddings x factor, for linear or dynamic scaling max_position_embeddings x
    factor; whichever is larger) a ValueError names both, unless $PACORE_ALLOW_LONG_MAX_MODEL_LEN (or
    vLLM's $VLLM_ALLOW_LONG_MAX_MODEL_LEN) is 1, as vLLM refuses it unless told."""
    environ = os.environ if environ is None else environ
    if max_model_len is None:
        return cfg.max_position_embeddings
    rope = dict(getattr(cfg.hf_config, "rope_parameters", None) or {})
    positions = cfg.max_position_embeddings
    kind, factor = rope.get("rope_type", "default"), rope.get("factor")
    limit, scaling = positions, "no RoPE scaling"
    if factor and kind != "default":
        scaling = f"{kind} RoPE scaling, factor {factor}"
        if kind not in ("llama3", "longrope", "su"):  # those scale within max_position_embeddings
            base = rope.get("original_max_position_embeddings", positions) if kind == "yarn" else positions
            limit = max(limit, int(base * factor))
            scaling += f" over {base:,} positions: {int(base * factor):,}"
    allowed = any(environ.get(v) == "1" for v in ("PACORE_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"))
    if max_model_len > limit and not allowed:
        raise ValueError(f"max_model_len {max_model_len:,} is beyond this model's context of {limit:,} tokens (its "
                         f"max_position_embeddings {positions:,}; {scaling}): positions past it were never trained. "
                         "Lower --max-model-len, scale RoPE with --rope-scaling, or set "
                         "PACORE_ALLOW_LONG_MAX_MODEL_LEN=1 to run it anyway (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
                         "is read too)")
    return max_model_len
