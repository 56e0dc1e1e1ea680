"""vLLM's request fields on pacore serve (issue 47): stream_options.continuous_usage_stats, the sampling
fields vLLM adds (min_tokens, include_stop_str_in_output, skip_special_tokens, ignore_eos, best_of, top_k 0),
the chat template's (chat_template_kwargs, add_generation_prompt, continue_final_message), and the ones
taken as vLLM takes them (request_id names the reply, priority 0 only, cache_salt, the rest ignored with a
warning); what would silently change a result (json_schema, tools) is still refused."""
import json
import logging
from types import SimpleNamespace

import httpx
import pytest
from server_helpers import serving

from engine import LLM
from engine.serve.app import create_app

KEY, MODEL = "k", "tiny"
EOS, PAD, A = 1, 0, ord("A")
# A Qwen3-like template: enable_thinking false (a chat_template_kwargs variable) writes a marker.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    llm.tokenizer.chat_template = TEMPLATE
    with serving(create_app(llm, MODEL, api_key=KEY)) as base:
        yield SimpleNamespace(base=base, llm=llm)


def _post(server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json={"model": MODEL, **body}, headers={"Authorization": f"Bearer {KEY}"},
                      **kw)


def _events(reply: httpx.Response) -> list[dict]:
    assert reply.status_code == 200, reply.text
    lines = [line.removeprefix("data: ") for line in reply.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("path, prompt", [("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions",
                                                                                 {"messages": USER})])
def test_continuous_usage_stats_puts_usage_in_every_chunk(server, path, prompt):
    # guidellm's default benchmark sends this on every streamed request (it got 422).
    body = {**prompt, "max_tokens": 4, "n": 2, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = _events(_post(server, path, body))
    *choices, last = chunks
    prompt_tokens = last["usage"]["prompt_tokens"]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 2 * 4
    for c in choices:
        (choice,) = c["choices"]
        usage = c["usage"]
        assert usage["prompt_tokens"] == prompt_tokens and 0 <= usage["completion_tokens"] <= 4
        assert usage["total_tokens"] == prompt_tokens + usage["completion_tokens"]
        if choice["finish_reason"] is not None:
            assert usage["completion_tokens"] == 4
    plain = _events(_post(server, path, {**body, "stream_options": {"include_usage": True}}))
    assert all(c.get("usage") is None for c in plain[:-1]) and plain[-1]["usage"] == last["usage"]


def _text(server, **body) -> dict:
    reply = _post(server, "/v1/completions", {"prompt": "hello", "temperature": 0, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_vllms_sampling_fields_are_honoured(server):
    assert _text(server, max_tokens=8, logit_bias={str(EOS): 100})["usage"]["completion_tokens"] == 1
    held = _text(server, max_tokens=8, logit_bias={str(EOS): 100}, min_tokens=3)
    assert held["usage"]["completion_tokens"] == 4 and held["choices"][0]["finish_reason"] == "stop"
    assert _text(server, max_tokens=3, logit_bias={str(EOS): 100}, ignore_eos=True)["usage"]["completion_tokens"] == 3
    stop = {"max_tokens": 4, "logit_bias": {str(A): 100}, "stop": ["A"]}
    assert _text(server, **stop)["choices"][0]["text"] == ""
    assert _text(server, **stop, include_stop_str_in_output=True)["choices"][0]["text"] == "A"
    special = {"max_tokens": 2, "logit_bias": {str(PAD): 100}}
    assert _text(server, **special)["choices"][0]["text"] == ""
    assert _text(server, **special, skip_special_tokens=False)["choices"][0]["text"] == "<0><0>"
    assert _text(server, max_tokens=2, top_k=0, best_of=1)["usage"]["completion_tokens"] == 2


def test_a_stream_keeps_the_stop_string_when_asked(server):
    body = {"prompt": "hello", "temperature": 0, "max_tokens": 4, "logit_bias": {str(A): 100}, "stop": ["A"],
            "include_stop_str_in_output": True, "stream": True}
    chunks = _events(_post(server, "/v1/completions", body))
    assert "".join(c["choices"][0]["text"] for c in chunks) == "A"


def _prompt_tokens(server, **body) -> int:
    reply = _post(server, "/v1/chat/completions", {"max_tokens": 1, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens"]


def test_the_chat_templates_fields_reach_the_template(server):
    # The tiny tokenizer is one token a character, so the prompt's length shows what the template wrote.
    plain = _prompt_tokens(server, messages=USER)
    assert plain == len("<user>Hi\n<assistant>")
    assert _prompt_tokens(server, messages=USER, chat_template_kwargs={"enable_thinking": False}) == plain + 9
    assert _prompt_tokens(server, messages=USER, add_generation_prompt=False) == plain - len("<assistant>")
    prefill = USER + [{"role": "assistant", "content": "The answer is"}]
    cont = _prompt_tokens(server, messages=prefill, add_generation_prompt=False, continue_final_message=True)
    assert cont == len("<user>Hi\n<assistant>The answer is")  # left open: no newline after it
    tokenized = _post(server, "/tokenize", {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}})
    assert tokenized.json()["count"] == plain + 9


@pytest.mark.parametrize("body, said", [
    ({"continue_final_message": True}, "add_generation_prompt to false"),
    ({"chat_template_kwargs": {"tokenize": True}}, "not a variable of the template"),
    ({"priority": 1}, "first come, first served"),
    ({"best_of": 2}, "best_of 2 is not supported"),
    ({"cache_salt": ""}, "cache_salt"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "no structured output"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "no tool calling"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens must be at most max_tokens"),
])
def test_what_vllm_refuses_or_would_change_the_result_is_refused_by_name(server, body, said):
    reply = _post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 1, **body})
    assert reply.status_code in (400, 422) and said in reply.json()["error"]["message"], reply.text
    assert reply.json()["error"]["param"] == next(iter(body))


def test_request_id_names_the_reply_and_the_ignored_fields_are_logged(server, caplog):
    assert _text(server, max_tokens=1, request_id="abc-1", cache_salt="s", priority=0)["id"] == "cmpl-abc-1"
    ignored = {"store": True, "metadata": {"k": "v"}, "service_tier": "auto", "reasoning_effort": "low",
               "parallel_tool_calls": False}
    with caplog.at_level(logging.WARNING, logger="pacore.serve"):
        reply = _post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 1, "request_id": "r2", **ignored})
    assert reply.status_code == 200 and reply.json()["id"] == "chatcmpl-r2"
    (record,) = [r for r in caplog.records if "ignored" in r.getMessage()]
    assert all(name in record.getMessage() for name in ignored)


# -- issue 52 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, reason", [
    ({"stop": ["A"]}, "A"), ({"stop_token_ids": [A]}, A), ({"max_tokens": 2}, None)])
def test_choices_carry_vllms_stop_reason(server, body, reason):
    body = {"max_tokens": 4, "logit_bias": {str(A): 100}, **body}
    (choice,) = _text(server, **body)["choices"]
    assert choice["stop_reason"] == reason and choice["finish_reason"] == ("length" if reason is None else "stop")
    chunks = _events(_post(server, "/v1/completions", {"prompt": "hello", "temperature": 0, "stream": True, **body}))
    assert chunks[-1]["choices"][0]["stop_reason"] == reason
    eos = _post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 4, "logit_bias": {str(EOS): 100}})
    assert eos.json()["choices"][0]["stop_reason"] is None and eos.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("field", ["messages", "add_generation_prompt", "continue_final_message", "tools",
                                   "documents", "chat_template"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_chat_template_kwargs_may_not_override_the_requests_own_fields(server, path, field):
    reply = _post(server, path, {"messages": USER, "max_tokens": 1, "chat_template_kwargs": {field: False}}
                  if path != "/tokenize" else {"messages": USER, "chat_template_kwargs": {field: False}})
    error = reply.json()["error"]
    assert reply.status_code == 422 and error["param"] == "chat_template_kwargs", reply.text
    assert repr(field) in error["message"], error


@pytest.mark.parametrize("rid", ["x" * 257, "a b", "a\nb", "é"])
def test_request_id_is_bounded_in_length_and_characters(server, rid):
    reply = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "request_id": rid})
    assert reply.status_code == 422 and reply.json()["error"]["param"] == "request_id", reply.text
    assert _text(server, max_tokens=1, request_id="A-z_0.9:" + "x" * 200)["id"].startswith("cmpl-A-z_0.9:")


@pytest.mark.parametrize("field, value, said", [
    ("guided_json", {"type": "object"}, "structured output"), ("use_beam_search", True, "beam search"),
    ("length_penalty", 1.0, "beam search"), ("allowed_token_ids", [1], "allowed_token_ids"),
    ("prompt_embeds", "x", "prompt embeddings")])
def test_a_vllm_only_field_is_named_as_a_vllm_feature_this_server_lacks(server, field, value, said):
    reply = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1, field: value})
    error = reply.json()["error"]
    assert reply.status_code == 422 and error["param"] == field, reply.text
    assert "vLLM" in error["message"] and said in error["message"] and "does not have" in error["message"], error


def test_vllms_harmless_fields_are_honoured(server):
    assert _text(server, max_tokens=1)["usage"]["prompt_tokens_details"] is None  # without the flag
    assert _text(server, max_tokens=1, use_beam_search=False, add_special_tokens=True)["usage"]["prompt_tokens"] == 5
    # truncate_prompt_tokens keeps the prompt's last N tokens (vLLM's); -1: as many as the context holds
    assert _text(server, max_tokens=1, truncate_prompt_tokens=2)["usage"]["prompt_tokens"] == 2
    assert _text(server, max_tokens=1, truncate_prompt_tokens=-1)["usage"]["prompt_tokens"] == 5
    plain = _prompt_tokens(server, messages=USER)
    assert _prompt_tokens(server, messages=USER, truncate_prompt_tokens=3, add_special_tokens=False) == 3
    assert _prompt_tokens(server, messages=USER, add_special_tokens=True) == plain  # the char tokenizer has no BOS
    assert _post(server, "/v1/completions", {"prompt": "hi", "truncate_prompt_tokens": 0}).status_code == 422


def test_add_special_tokens_reaches_the_tokenizer_as_vllm_means_it(server, monkeypatch):
    from engine.serve.prompts import PromptReader
    seen = []
    tok = server.llm.tokenizer
    monkeypatch.setattr(type(tok), "encode", lambda self, text, add_special_tokens=True, **kw: seen.append(
        add_special_tokens) or [ord(c) for c in text])
    reader = PromptReader(tok, 256)
    params = SimpleNamespace(max_tokens=1)
    reader.token_ids("hi", False, params), reader.token_ids("hi", False, params, add_special_tokens=False)
    reader.token_ids(USER, True, params), reader.token_ids(USER, True, params, add_special_tokens=True)
    assert seen == [True, False, False, True]  # completions add them by default, chat (a template's own) not


def test_prompt_tokens_details_count_the_cached_prompt_tokens_when_enabled(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    prompt = "a prompt of several KV blocks, " * 2  # 62 tokens: 3 full blocks of 16
    with serving(create_app(llm, MODEL, prompt_tokens_details=True)) as base:
        def usage():
            reply = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
            return reply.json()["usage"]
        assert usage()["prompt_tokens_details"] == {"cached_tokens": 0}
        assert usage()["prompt_tokens_details"] == {"cached_tokens": 48}
