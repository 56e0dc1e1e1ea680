"""--max-model-len beyond the model's context is refused, naming the model's limit and its RoPE scaling, as
vLLM refuses it unless $VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (issue 47: 99,999 on an 8,192-token model started
without a word). The tiny llama: 1024 positions, llama3 RoPE (its max_position_embeddings already scaled);
the tiny qwen3: 1024 positions, YaRN x2 over 512."""
import pytest

from engine import LLM
from engine.config import ModelConfig
from engine.context_length import check_max_model_len


def test_a_context_beyond_the_models_is_refused_naming_its_limit(tiny_model_dir):
    cfg = ModelConfig.from_pretrained(tiny_model_dir("llama"))
    assert check_max_model_len(cfg, None, {}) == 1024 and check_max_model_len(cfg, 1024, {}) == 1024
    with pytest.raises(ValueError) as e:
        check_max_model_len(cfg, 99_999, {})
    message = str(e.value)
    assert "99,999" in message and "context of 1,024 tokens" in message and "llama3 RoPE scaling, factor 8.0" in message
    assert "PACORE_ALLOW_LONG_MAX_MODEL_LEN=1" in message
    for var in ("PACORE_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        assert check_max_model_len(cfg, 99_999, {var: "1"}) == 99_999
    with pytest.raises(ValueError, match="max_model_len 2,048"):
        LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=2048)


def test_rope_scaling_extends_the_limit_as_vllm_derives_it(tiny_model_dir):
    qwen = ModelConfig.from_pretrained(tiny_model_dir("qwen3"))  # YaRN x2 over 512 = its 1024
    with pytest.raises(ValueError, match=r"yarn RoPE scaling, factor 2.0 over 512 positions: 1,024"):
        check_max_model_len(qwen, 1025, {})
    longer = ModelConfig.from_pretrained(tiny_model_dir("qwen3"), rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert check_max_model_len(longer, 2048, {}) == 2048  # 512 x 4
    with pytest.raises(ValueError, match="2,048 tokens"):
        check_max_model_len(longer, 2049, {})
