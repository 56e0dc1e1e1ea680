"""What vLLM's clients and dashboards find on pacore serve: /tokenize and /detokenize in vLLM's shapes
(the ids the completion routes generate from, behind the API key, errors that name the problem), and
the engine's metrics under vLLM's names (docs/serving.md's table)."""
import json
from types import SimpleNamespace

import httpx
import openai
import pytest
from server_helpers import metrics, serving

from engine import LLM
from engine.serve.app import create_app

KEY, MODEL = "k", "tiny"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 7 * 6?"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    app = create_app(llm, MODEL, api_key=KEY, aliases=("default",))
    with serving(app) as base:
        yield SimpleNamespace(base=base, llm=llm)


def _post(server, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return httpx.post(f"{server.base}{path}", content=json.dumps(body), headers=headers)


def test_tokenize_a_text_in_vllms_shape(server):
    reply = _post(server, "/tokenize", {"model": MODEL, "prompt": "abc cab"})
    assert reply.status_code == 200
    ids = server.llm.tokenizer.encode("abc cab")
    assert reply.json() == {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}
    bare = _post(server, "/tokenize", {"prompt": "abc", "add_special_tokens": False, "return_token_strs": True}).json()
    assert bare["tokens"] == server.llm.tokenizer.encode("abc", add_special_tokens=False)
    assert bare["token_strs"] == server.llm.tokenizer.convert_ids_to_tokens(bare["tokens"])


def test_tokenize_messages_counts_what_chat_completions_prefill(server):
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
    usage = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1).usage
    chat = _post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES}).json()
    assert chat["count"] == usage.prompt_tokens == len(chat["tokens"])
    without = _post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert without["count"] < chat["count"] and chat["tokens"][:without["count"]] == without["tokens"]


def test_detokenize_inverts_tokenize(server):
    ids = _post(server, "/tokenize", {"prompt": "a b c", "add_special_tokens": False}).json()["tokens"]
    assert _post(server, "/detokenize", {"model": "default", "tokens": ids}).json() == {"prompt": "a b c"}


@pytest.mark.parametrize("path, body, key, status, said", [
    ("/tokenize", {"prompt": "x"}, None, 401, "API key"),
    ("/detokenize", {"tokens": [1]}, "wrong", 401, "API key"),
    ("/tokenize", {"model": "other", "prompt": "x"}, KEY, 404, "serves `tiny`"),
    ("/detokenize", {"tokens": [10 ** 6]}, KEY, 400, "not in the tokenizer's vocabulary"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, KEY, 400, "add_generation_prompt to false"),
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, KEY, 422, "not a field"),
    ("/detokenize", {"tokens": "abc"}, KEY, 422, "tokens"),
])
def test_tokenizer_route_errors_name_the_problem(server, path, body, key, status, said):
    reply = _post(server, path, body, key)
    assert reply.status_code == status and said in reply.json()["error"]["message"]


def test_vllm_metric_names_carry_the_engines_figures(server):
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
    client.completions.create(model=MODEL, prompt="abcabc", max_tokens=3, n=2, extra_body={"ignore_eos": True})
    m = metrics(server.base)
    label = '{model_name=tiny}'
    ours = {k: m[k] for k in ("pacore_prefill_tokens_total", "pacore_prefix_cache_hit_tokens_total",
                              "pacore_decode_tokens_total", "pacore_preemptions_total", "pacore_kv_blocks_used",
                              "pacore_kv_blocks_total", "pacore_num_sequences_running", "pacore_num_sequences_waiting")}
    prompt = ours["pacore_prefill_tokens_total"] + ours["pacore_prefix_cache_hit_tokens_total"]
    assert m[f"vllm:prompt_tokens_total{label}"] == m[f"vllm:prefix_cache_queries_total{label}"] == prompt > 0
    assert m[f"vllm:prefix_cache_hits_total{label}"] == ours["pacore_prefix_cache_hit_tokens_total"]
    assert m[f"vllm:generation_tokens_total{label}"] == ours["pacore_decode_tokens_total"] == 2 * 2  # after the first
    assert m[f"vllm:num_preemptions_total{label}"] == ours["pacore_preemptions_total"]
    usage = ours["pacore_kv_blocks_used"] / ours["pacore_kv_blocks_total"]
    assert m[f"vllm:kv_cache_usage_perc{label}"] == m[f"vllm:gpu_cache_usage_perc{label}"] == usage
    assert m[f"vllm:num_requests_running{label}"] == ours["pacore_num_sequences_running"] == 0
    assert m[f"vllm:num_requests_waiting{label}"] == ours["pacore_num_sequences_waiting"] == 0
    assert not any(k.startswith("vllm:spec_decode") for k in m)  # without --speculative-config


def test_the_docs_map_every_vllm_name_exposed(server):
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    exposed = {k.partition("{")[0].removesuffix("_total") for k in metrics(server.base) if k.startswith("vllm:")}
    spec = {"vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
            "vllm:spec_decode_num_accepted_tokens_per_pos"}  # with --speculative-config (tests/server/test_server_spec.py)
    for name in exposed | spec:
        assert f"`{name}" in page, name
