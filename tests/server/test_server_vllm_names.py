"""What vLLM's clients and dashboards find on pacore serve: /tokenize and /detokenize in vLLM's shapes
(the ids the completion routes generate from, behind the API key, errors that name the problem), and
the engine's metrics under vLLM's names (docs/serving.md's table)."""
import json
import re
from types import SimpleNamespace

import httpx
import openai
import pytest
from server_helpers import metrics, serving

from engine import LLM
from engine.serve.app import create_app
from engine.serve.info import package_version
from prometheus_client import CONTENT_TYPE_LATEST

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
    generated = metrics(server.base)["vllm:generation_tokens_total{model_name=tiny}"]  # by the tests before
    client.completions.create(model=MODEL, prompt="abcabc", max_tokens=3, n=2, extra_body={"ignore_eos": True})
    m = metrics(server.base)
    label = '{model_name=tiny}'
    ours = {k: m[k] for k in ("pacore_prefill_tokens_total", "pacore_prefix_cache_hit_tokens_total",
                              "pacore_decode_tokens_total", "pacore_preemptions_total", "pacore_kv_blocks_used",
                              "pacore_kv_blocks_total", "pacore_num_sequences_running", "pacore_num_sequences_waiting")}
    prompt = ours["pacore_prefill_tokens_total"] + ours["pacore_prefix_cache_hit_tokens_total"]
    assert m[f"vllm:prompt_tokens_total{label}"] == m[f"vllm:prefix_cache_queries_total{label}"] == prompt > 0
    assert m[f"vllm:prefix_cache_hits_total{label}"] == ours["pacore_prefix_cache_hit_tokens_total"]
    # Every token generated, each choice's first too (it left those out: issue 47); decode computed the rest.
    assert m[f"vllm:generation_tokens_total{label}"] - generated == 2 * 3
    assert m[f"vllm:num_preemptions_total{label}"] == ours["pacore_preemptions_total"]
    usage = ours["pacore_kv_blocks_used"] / ours["pacore_kv_blocks_total"]
    assert m[f"vllm:kv_cache_usage_perc{label}"] == m[f"vllm:gpu_cache_usage_perc{label}"] == usage
    assert m[f"vllm:num_requests_running{label}"] == ours["pacore_num_sequences_running"] == 0
    assert m[f"vllm:num_requests_waiting{label}"] == ours["pacore_num_sequences_waiting"] == 0
    assert not any(k.startswith("vllm:spec_decode") for k in m)  # without --speculative-config


def test_the_docs_map_every_vllm_name_exposed(server):
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    exposed = {re.sub(r"_(total|created|bucket|sum|count)$", "", k.partition("{")[0])
               for k in metrics(server.base) if k.startswith("vllm:")}
    spec = {"vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
            "vllm:spec_decode_num_accepted_tokens_per_pos"}  # with --speculative-config (tests/server/test_server_spec.py)
    for name in exposed | spec:
        assert f"`{name}" in page, name


def test_vllms_routes_version_ping_model_and_tokenizer_info(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{server.base}/version").json() == {"version": package_version()}
    assert httpx.get(f"{server.base}/ping").status_code == httpx.post(f"{server.base}/ping").status_code == 200
    card = httpx.get(f"{server.base}/v1/models/{MODEL}", headers=auth).json()
    assert card["id"] == MODEL and card["max_model_len"] == 256 and card["object"] == "model"
    missing = httpx.get(f"{server.base}/v1/models/other", headers=auth)
    assert missing.status_code == 404 and "serves `tiny`" in missing.json()["error"]["message"]
    # What lm-eval's tokenizer_backend=remote reads (its RemoteTokenizer): the special tokens as text,
    # which it encodes through /tokenize, and the chat template it renders itself.
    assert httpx.get(f"{server.base}/tokenizer_info").status_code == 401  # behind the key, as /tokenize
    info = httpx.get(f"{server.base}/tokenizer_info", headers=auth).json()
    tok = server.llm.tokenizer
    assert (info["eos_token"], info["pad_token"], info["unk_token"]) == ("<1>", "<0>", "<0>")
    assert info["chat_template"] == tok.chat_template and info["tokenizer_class"] == type(tok).__name__
    eos = _post(server, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}).json()["tokens"]
    assert eos == [tok.eos_token_id]


def test_a_post_to_a_get_route_is_405_and_openapi_lists_the_errors(server):
    for path in ("/health", "/metrics", "/version", "/v1/models"):
        reply = httpx.post(f"{server.base}{path}", headers={"Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 405 and "GET" in reply.headers["allow"], (path, reply.text)
    spec = httpx.get(f"{server.base}/openapi.json").json()["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        assert {"200", "400", "404", "415", "422"} <= set(spec[path]["post"]["responses"]), path
    assert list(spec["/metrics"]["get"]["responses"]["200"]["content"]) == [CONTENT_TYPE_LATEST]
    assert httpx.get(f"{server.base}/metrics").headers["content-type"] == CONTENT_TYPE_LATEST


def test_openapi_lists_401_exactly_where_a_key_is_required(server):
    guarded = [("/v1/completions", "post"), ("/v1/chat/completions", "post"), ("/tokenize", "post"),
               ("/detokenize", "post"), ("/v1/models", "get"), ("/v1/models/{model}", "get"), ("/tokenizer_info", "get")]
    spec = httpx.get(f"{server.base}/openapi.json").json()["paths"]
    for path, method in guarded:
        assert "401" in spec[path][method]["responses"], path
    for path in ("/health", "/metrics", "/version"):  # open, as vLLM's
        assert "401" not in spec[path]["get"]["responses"], path
    keyless = create_app(server.llm, MODEL).openapi()["paths"]  # no key: nothing answers 401
    assert not [p for p, ops in keyless.items() for op in ops.values() if "401" in op["responses"]]


# Every metric name the queries of vLLM's sample Grafana dashboard read, from
# examples/online_serving/prometheus_grafana/grafana.json in vllm-project/vllm (commit 004f771f3a6b: its 14
# panels), and the ones issue 47 names from the dashboard's later revision (inter_token_latency_seconds,
# request_params_n, request_params_max_tokens, iteration_tokens_total, cache_config_info). A histogram is read
# as its _bucket, _sum and _count series.
DASHBOARD_HISTOGRAMS = ("vllm:e2e_request_latency_seconds", "vllm:time_per_output_token_seconds",
                        "vllm:time_to_first_token_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                        "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                        "vllm:request_decode_time_seconds", "vllm:request_max_num_generation_tokens",
                        "vllm:inter_token_latency_seconds", "vllm:request_params_n", "vllm:request_params_max_tokens",
                        "vllm:iteration_tokens_total")
DASHBOARD_SERIES = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_requests_running",
                    "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:request_success_total",
                    "vllm:cache_config_info")


def test_every_metric_of_vllms_grafana_dashboard_is_exported_after_a_request(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)  # counters of its own
    with serving(create_app(llm, MODEL, api_key=KEY)) as base:
        srv = SimpleNamespace(base=base, llm=llm)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
        client.completions.create(model=MODEL, prompt="abcabc", max_tokens=4, n=2, extra_body={"ignore_eos": True})
        client.completions.create(model=MODEL, prompt="x", max_tokens=8, extra_body={"logit_bias": {"1": 100}})
        m = metrics(srv.base)
    label = f"model_name={MODEL}"
    for name in DASHBOARD_HISTOGRAMS:
        assert m[f"{name}_count{{{label}}}"] >= 1, name
        assert f"{name}_sum{{{label}}}" in m and f"{name}_bucket{{le=+Inf,{label}}}" in m, name
    for name in DASHBOARD_SERIES:
        assert any(k.partition("{")[0] == name for k in m), name
    # The figures: two prompts; three choices, two of 4 tokens (length), one stopped by EOS at once.
    assert m[f"vllm:request_prompt_tokens_count{{{label}}}"] == m[f"vllm:e2e_request_latency_seconds_count{{{label}}}"] == 2
    assert m[f"vllm:request_generation_tokens_count{{{label}}}"] == 3
    assert m[f"vllm:request_generation_tokens_sum{{{label}}}"] == m[f"vllm:generation_tokens_total{{{label}}}"] == 9
    assert m[f"vllm:request_success_total{{finished_reason=length,{label}}}"] == 2
    assert m[f"vllm:request_success_total{{finished_reason=stop,{label}}}"] == 1
    assert m[f"vllm:request_params_n_sum{{{label}}}"] == 3 and m[f"vllm:request_params_max_tokens_sum{{{label}}}"] == 12
    assert m[f"vllm:request_max_num_generation_tokens_sum{{{label}}}"] == 4 + 1
    assert m[f"vllm:iteration_tokens_total_sum{{{label}}}"] == (m["pacore_prefill_tokens_total"]
                                                                 + m[f"vllm:generation_tokens_total{{{label}}}"])
    (info,) = [k for k in m if k.startswith("vllm:cache_config_info")]
    assert "block_size=16" in info and "cache_dtype=auto" in info and "num_gpu_blocks=64" in info
