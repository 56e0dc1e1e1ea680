"""Bad input gets a clear error that names the problem and the fix."""
import json

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=512)


def test_missing_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        LLM(str(tmp_path / "does-not-exist"))


def test_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(str(tmp_path))


def test_unsupported_architecture(tmp_path, tiny_model_dir):
    src = tiny_model_dir("llama")
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture.*GPT2LMHeadModel"):
        LLM(str(tmp_path))


def test_missing_weights(tmp_path, tiny_model_dir):
    src = tiny_model_dir("llama")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(tmp_path))


def test_prompt_too_long(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.add_request(list(range(3, 200)) * 3, SamplingParams(max_tokens=4))


def test_prompt_plus_max_tokens_beyond_max_model_len(llm):
    with pytest.raises(ValueError, match="exceeds max_model_len=512"):
        llm.add_request([5] * 100, SamplingParams(max_tokens=450))


def test_prompt_plus_max_tokens_beyond_cache(llm):
    with pytest.raises(ValueError, match="whole KV cache"):
        llm.add_request([5] * 100, SamplingParams(max_tokens=300))  # cache holds 16 * 16 = 256 tokens
    assert not llm.has_unfinished()  # nothing half-queued


@pytest.mark.parametrize("kwargs, match", [
    (dict(n=0), "n must be"), (dict(temperature=-0.5), "temperature"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"), (dict(max_tokens=0), "max_tokens"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_token_ids(llm):
    with pytest.raises(ValueError, match="vocabulary"):
        llm.add_request([1, 2, 100000], SamplingParams())
    with pytest.raises(ValueError, match="empty prompt"):
        llm.add_request([], SamplingParams())


def test_bad_backend(tiny_model_dir):
    with pytest.raises(ValueError, match="attention_backend"):
        LLM(str(tiny_model_dir("llama")), num_kv_blocks=8, attention_backend="cuda-magic")


def test_stop_strings_and_tokens(llm):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    free = llm.generate([[10, 20, 30]], params, use_tqdm=False)[0].outputs[0]
    stop_tok = free.token_ids[5]
    first = free.token_ids.index(stop_tok)
    by_token = llm.generate([[10, 20, 30]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                           stop_token_ids=[stop_tok]), use_tqdm=False)[0]
    assert by_token.outputs[0].token_ids == free.token_ids[:first + 1]
    assert by_token.outputs[0].finish_reason == "stop"
    text = free.text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    by_string = llm.generate([[10, 20, 30]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                            stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert by_string.finish_reason == "stop"
    assert by_string.text == text[:text.index(stop)]


def test_bad_prompt_in_a_batch_queues_nothing(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[5, 6, 7], [5] * 600], SamplingParams(max_tokens=4), use_tqdm=False)
    assert not llm.has_unfinished() and not llm.scheduler.has_work()


def test_abort_frees_blocks(llm):
    rid = llm.add_request([5] * 40, SamplingParams(n=3, max_tokens=20, ignore_eos=True))
    llm.step()
    llm.step()
    assert llm.block_manager.num_used > 0
    llm.abort_request(rid)
    assert not llm.has_unfinished() and llm.block_manager.num_used == 0
    out = llm.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_seeds_outside_int64_and_uint64_are_refused_not_aliased():
    for seed in (2 ** 64, -2 ** 63 - 1):  # each would alias another seed modulo 2**64
        with pytest.raises(ValueError, match=r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"):
            SamplingParams(seed=seed)
    for seed in (-2 ** 63, 2 ** 64 - 1):
        SamplingParams(seed=seed)
