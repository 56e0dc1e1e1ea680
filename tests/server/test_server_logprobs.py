"""Log-probabilities over HTTP with the real openai client (issue #21): chat's logprobs/top_logprobs,
completions' logprobs and echo (lm-eval's loglikelihood), vLLM's prompt_logprobs, streams, limits.

Every served value is compared with the engine's own (``LLM.generate`` with the same SamplingParams,
greedy or seeded) for equality, not closeness: JSON carries a float exactly. Each test sends prompts
of its own, so no prompt's blocks come from another test's prefix cache.
"""
from types import SimpleNamespace

import httpx
import openai
import pytest
from server_helpers import serving

from engine import LLM, SamplingParams
from engine.chat import chat_prompt_ids
from engine.serve.app import create_app

MODEL = "tiny"
NO_EOS = {"ignore_eos": True}
FLOOR = -9999.0  # what -inf is sent as


def _llm(tiny_model_dir, **options):
    return LLM(str(tiny_model_dir("llama")), num_kv_blocks=256, max_model_len=512, **options)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = _llm(tiny_model_dir)
    with serving(create_app(llm, MODEL)) as base:
        yield SimpleNamespace(base=base, llm=llm, direct=_llm(tiny_model_dir))


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0)


def _engine(llm, prompt_ids, **params):
    return llm.generate([prompt_ids], SamplingParams(**params), use_tqdm=False)[0]


def _chat_ids(llm, content):
    return chat_prompt_ids(llm.tokenizer, [{"role": "user", "content": content}])


def _chat_expected(x, num_top):
    """Chat's logprobs.content from the engine's TokenLogprobs: the chosen token, the top N in rank order."""
    out = []
    for i, entry in enumerate(x):
        chosen = entry[x.token_ids[i]]
        assert chosen.logprob == x.logprobs[i]
        top = [(entry[t].decoded_token, lp) for t, lp in x.top(i)]
        assert len(top) == num_top
        out.append((chosen.decoded_token, x.logprobs[i], top))
    return out


def _chat_served(content):
    for c in content:
        assert c.bytes == list(c.token.encode()) and all(t.bytes == list(t.token.encode()) for t in c.top_logprobs)
    return [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs]) for c in content]


def _completion_expected(x, tokenizer=None, prompt_ids=None, prompt_logprobs=None):
    """Completions' logprobs from the engine's: (tokens, token_logprobs, top_logprobs), the echoed prompt first."""
    entries = list(prompt_logprobs or []) + list(x or [])
    ids = list(prompt_ids or []) + (x.token_ids if x is not None else [])
    tokens, chosen, tops = [], [], []
    for token_id, entry in zip(ids, entries):
        if entry is None:  # a prompt's first token
            tokens.append(tokenizer.decode([token_id]))
            chosen.append(None)
            tops.append(None)
        else:
            tokens.append(entry[token_id].decoded_token)
            chosen.append(entry[token_id].logprob)
            tops.append({lp.decoded_token: max(lp.logprob, FLOOR) for lp in entry.values()})
    return tokens, chosen, tops


def _check_offsets(logprobs, text, tokenizer):
    """text_offset starts at 0, adds up the tokens' texts, and points at each token in the text."""
    offsets, tokens = logprobs.text_offset, logprobs.tokens
    assert offsets[0] == 0 and all(b == a + len(t) for a, b, t in zip(offsets, offsets[1:], tokens))
    special = set(tokenizer.all_special_tokens)  # left out of the text (skip_special_tokens), not of tokens
    for offset, token in zip(offsets, tokens):
        if token not in special and offset < len(text):
            assert text[offset:offset + len(token)] == token


def test_chat_logprobs_equal_the_engines(server, client):
    content = "chat logprobs, greedy"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], temperature=0,
                                       max_tokens=8, logprobs=True, top_logprobs=3, extra_body=NO_EOS)
    expected = _engine(server.direct, _chat_ids(server.direct, content), temperature=0, max_tokens=8, ignore_eos=True,
                       logprobs=3).outputs[0]
    (choice,) = r.choices
    assert choice.message.content == expected.text and len(choice.logprobs.content) == 8
    assert _chat_served(choice.logprobs.content) == _chat_expected(expected.logprobs, 3)
    # Greedy: the chosen token is the most likely one.
    assert all(c.top_logprobs[0].token == c.token for c in choice.logprobs.content)
    # Sampled (seeded, n=2): the top 2 in rank order, whether the chosen token is among them or not.
    content = "chat logprobs, sampled"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], n=2, seed=3,
                                       max_tokens=12, logprobs=True, top_logprobs=2, extra_body=NO_EOS)
    out = _engine(server.direct, _chat_ids(server.direct, content), n=2, seed=3, max_tokens=12, ignore_eos=True,
                  logprobs=2)
    for choice in r.choices:
        assert _chat_served(choice.logprobs.content) == _chat_expected(out.outputs[choice.index].logprobs, 2)
    assert any(c.top_logprobs[0].token != c.token for choice in r.choices for c in choice.logprobs.content)
    # logprobs without top_logprobs: the chosen token's only; and none unless asked.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=3,
                                       logprobs=True, extra_body=NO_EOS)
    assert [c.top_logprobs for c in r.choices[0].logprobs.content] == [[], [], []]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=3)
    assert r.choices[0].logprobs is None


def test_completion_logprobs_equal_the_engines_and_offsets_follow_the_text(server, client):
    prompt = "completion logprobs: "
    r = client.completions.create(model=MODEL, prompt=prompt, n=2, seed=9, max_tokens=10, logprobs=2, extra_body=NO_EOS)
    tok = server.direct.tokenizer
    out = _engine(server.direct, tok.encode(prompt), n=2, seed=9, max_tokens=10, ignore_eos=True, logprobs=2)
    for choice in r.choices:
        expected = out.outputs[choice.index]
        lp = choice.logprobs
        assert choice.text == expected.text and len(lp.tokens) == r.usage.completion_tokens // 2 == 10
        assert (lp.tokens, lp.token_logprobs, lp.top_logprobs) == _completion_expected(expected.logprobs)
        # The top 2 and the chosen token: 2 entries, or 3 when it is not among them.
        assert {len(top) for top in lp.top_logprobs} <= {2, 3}
        _check_offsets(lp, choice.text, tok)
    assert any(len(top) == 3 for c in r.choices for top in c.logprobs.top_logprobs)
    # logprobs=0: the chosen token's alone.
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, logprobs=0, extra_body=NO_EOS)
    assert [len(top) for top in r.choices[0].logprobs.top_logprobs] == [1] * 4
    assert r.choices[0].logprobs.top_logprobs[0] == {r.choices[0].logprobs.tokens[0]:
                                                     r.choices[0].logprobs.token_logprobs[0]}


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_as_lm_eval_loglikelihood_sends_it(server, client, max_tokens):
    # lm-eval's local-completions: token ids, echo, logprobs=1, max_tokens 0 (or 1), temperature 0.
    tok = server.direct.tokenizer
    prompts = [tok.encode(f"echo {max_tokens}: the context"), tok.encode(f"echo {max_tokens}: another, longer one")]
    r = client.completions.create(model=MODEL, prompt=prompts, echo=True, logprobs=1, max_tokens=max_tokens,
                                  temperature=0, extra_body=NO_EOS)
    assert [c.index for c in r.choices] == [0, 1]
    # One batch, as the server runs them (a row's float rounding may depend on its batch).
    outs = server.direct.generate(prompts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=1,
                                                          prompt_logprobs=1), use_tqdm=False)
    for choice, ids, out in zip(r.choices, prompts, outs):
        generated = out.outputs[0] if max_tokens else None
        lp = choice.logprobs
        assert choice.text == tok.decode(ids) + (generated.text if generated else "")
        assert len(lp.tokens) == len(ids) + max_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
        assert (lp.tokens, lp.token_logprobs, lp.top_logprobs) == _completion_expected(
            generated.logprobs if generated else None, tok, ids, out.prompt_logprobs)
        _check_offsets(lp, choice.text, tok)
        # The echo's prompt logprobs go out once, in logprobs (vLLM also puts them in prompt_logprobs).
        assert choice.model_extra["prompt_logprobs"] is None
    # As vLLM, max_tokens 0 ran the engine for one token, which usage counts.
    assert r.usage.prompt_tokens == sum(map(len, prompts)) and r.usage.completion_tokens == 2
    # Echo without logprobs: the text only; a text prompt is echoed as sent.
    r = client.completions.create(model=MODEL, prompt="echo text: ", echo=True, max_tokens=3, temperature=0,
                                  extra_body=NO_EOS)
    expected = _engine(server.direct, tok.encode("echo text: "), temperature=0, max_tokens=3, ignore_eos=True)
    assert r.choices[0].text == "echo text: " + expected.outputs[0].text and r.choices[0].logprobs is None


def _stream_completions(stream):
    """Per choice: its chunks' (text, logprobs), in order."""
    chunks = {}
    for chunk in stream:
        for c in chunk.choices:
            chunks.setdefault(c.index, []).append((c.text, c.logprobs))
    return chunks


def _joined(chunks):
    text = "".join(t for t, _ in chunks)
    fields = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return text, {f: [v for _, lp in chunks if lp is not None for v in getattr(lp, f)] for f in fields}


@pytest.mark.parametrize("echo", [False, True])
def test_a_completions_stream_sends_the_logprobs_of_the_whole_reply(client, echo):
    kw = dict(model=MODEL, prompt=f"stream, echo={echo}: ", n=2, seed=4, max_tokens=12, logprobs=3, echo=echo,
              extra_body=NO_EOS)
    full = client.completions.create(**kw)
    free = full.choices[0].text.removeprefix(kw["prompt"] if echo else "")
    stop = free[5:7]  # held back while it may be a stop string: logprobs go on regardless
    full = client.completions.create(stop=[stop], **kw)
    streamed = _stream_completions(client.completions.create(stop=[stop], stream=True, **kw))
    assert full.choices[0].finish_reason == "stop"  # stopped early, while choice 1 went on
    for choice in full.choices:
        text, logprobs = _joined(streamed[choice.index])
        assert text == choice.text and logprobs == choice.logprobs.model_dump()
        if echo:  # the prompt comes first, whole, with its logprobs (with a reader that lags, tokens after it)
            first_text, first = streamed[choice.index][0]
            assert first_text.startswith(kw["prompt"]) and len(first.tokens) >= len(kw["prompt"])
            assert "".join(first.tokens[:len(kw["prompt"])]) == kw["prompt"] and first.token_logprobs[0] is None


def test_an_echo_stream_with_max_tokens_0_sends_the_prompt_alone(client):
    kw = dict(model=MODEL, prompt="stream the prompt alone", echo=True, logprobs=2, max_tokens=0, extra_body=NO_EOS)
    full = client.completions.create(**kw)
    streamed = _stream_completions(client.completions.create(stream=True, **kw))
    text, logprobs = _joined(streamed[0])
    assert text == full.choices[0].text == kw["prompt"] and logprobs == full.choices[0].logprobs.model_dump()
    assert len(logprobs["tokens"]) == len(kw["prompt"])


def test_a_chat_stream_sends_the_logprobs_of_the_whole_reply(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "a chat stream"}], n=2, seed=8, max_tokens=14,
              logprobs=True, top_logprobs=4, extra_body=NO_EOS)
    stop = client.chat.completions.create(**kw).choices[0].message.content[6:8]
    full = client.chat.completions.create(stop=[stop], **kw)
    content, text = {}, {}
    for chunk in client.chat.completions.create(stop=[stop], stream=True, **kw):
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + (c.delta.content or "")
            content.setdefault(c.index, []).extend(c.logprobs.content if c.logprobs else [])
    assert full.choices[0].finish_reason == "stop"
    for choice in full.choices:
        assert text[choice.index] == choice.message.content
        assert [c.model_dump() for c in content[choice.index]] == [c.model_dump() for c in choice.logprobs.content]
    assert sum(len(c.logprobs.content) for c in full.choices) == full.usage.completion_tokens


def _served_prompt_logprobs(served):
    return [None if d is None else {int(t): (lp["logprob"], lp["rank"], lp["decoded_token"]) for t, lp in d.items()}
            for d in served]


def _engine_prompt_logprobs(entries):
    return [None if d is None else {t: (lp.logprob, lp.rank, lp.decoded_token) for t, lp in d.items()}
            for d in entries]


def test_prompt_logprobs_are_where_vllm_puts_them(server, client):
    tok = server.direct.tokenizer
    prompt = "prompt logprobs of a completion"
    r = client.completions.create(model=MODEL, prompt=prompt, n=2, max_tokens=2, extra_body={"prompt_logprobs": 2})
    out = _engine(server.direct, tok.encode(prompt), max_tokens=1, prompt_logprobs=2)
    expected = _engine_prompt_logprobs(out.prompt_logprobs)
    assert expected[0] is None and len(expected) == len(prompt) and {len(d) for d in expected[1:]} <= {2, 3}
    for choice in r.choices:  # on each choice, as vLLM
        assert _served_prompt_logprobs(choice.model_extra["prompt_logprobs"]) == expected
        assert choice.logprobs is None
    content = "prompt logprobs of a chat"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2,
                                       extra_body={"prompt_logprobs": 1})
    out = _engine(server.direct, _chat_ids(server.direct, content), max_tokens=1, prompt_logprobs=1)
    assert _served_prompt_logprobs(r.model_extra["prompt_logprobs"]) == _engine_prompt_logprobs(out.prompt_logprobs)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert r.choices[0].model_extra["prompt_logprobs"] is None


def test_processed_logprobs_are_the_distribution_sampled_from(tiny_model_dir):
    # --logprobs-mode processed_logprobs: after temperature and top-k, so all but k tokens are -inf.
    llm = _llm(tiny_model_dir, logprobs_mode="processed_logprobs")
    direct = _llm(tiny_model_dir, logprobs_mode="processed_logprobs")
    with serving(create_app(llm, MODEL)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        r = client.completions.create(model=MODEL, prompt="processed", seed=2, temperature=0.7, max_tokens=6,
                                      logprobs=5, extra_body={**NO_EOS, "top_k": 3})
    out = _engine(direct, direct.tokenizer.encode("processed"), seed=2, temperature=0.7, top_k=3, max_tokens=6,
                  ignore_eos=True, logprobs=5).outputs[0]
    lp = r.choices[0].logprobs
    assert (lp.tokens, lp.token_logprobs, lp.top_logprobs) == _completion_expected(out.logprobs)
    for top in lp.top_logprobs:
        assert sorted(top.values()).count(FLOOR) == len(top) - 3  # filtered out: -inf, sent as -9999.0


def _error(fn, **kw):
    with pytest.raises(openai.APIStatusError) as e:
        fn(**kw)
    message = e.value.body["message"]
    assert "Value error" not in message
    return e.value.status_code, e.value.body["param"], message


def test_limits_are_named_in_plain_sentences(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=128, max_logprobs=3)
    with serving(create_app(llm, MODEL)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        chat = dict(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1)
        comp = dict(model=MODEL, prompt="x", max_tokens=1)
        create_chat, create = client.chat.completions.create, client.completions.create
        # The limit is the engine's max_logprobs (3 here; 20 by default, vLLM's).
        status, param, message = _error(create_chat, logprobs=True, top_logprobs=4, **chat)
        assert (status, param) == (400, "top_logprobs") and "[0, 3]" in message and "--max-logprobs" in message
        assert create_chat(logprobs=True, top_logprobs=3, **chat).choices[0].logprobs.content[0].top_logprobs
        assert _error(create, logprobs=4, **comp)[:2] == (400, "logprobs")
        assert _error(create, logprobs=-1, **comp)[:2] == (400, "logprobs")
        assert _error(create, extra_body={"prompt_logprobs": 4}, **comp)[:2] == (400, "prompt_logprobs")
        status, param, message = _error(create_chat, top_logprobs=2, **chat)  # without logprobs: true
        assert (status, param) == (400, "top_logprobs") and "set logprobs to true" in message
        status, param, message = _error(create, stream=True, extra_body={"prompt_logprobs": 1}, **comp)
        assert (status, param) == (400, "prompt_logprobs") and "stream" in message
        assert _error(create, model=MODEL, prompt="x", max_tokens=0)[:2] == (400, "max_tokens")  # 0: echo only
        # Truly unsupported: 422, saying what to do instead.
        status, param, message = _error(create_chat, response_format={"type": "json_schema", "json_schema": {}}, **chat)
        assert (status, param) == (422, "response_format") and "'json_schema' is not supported" in message
        assert _error(create_chat, response_format={"type": "json_object"}, **chat)[:2] == (422, "response_format")
        status, param, message = _error(create_chat, tools=[{"type": "function", "function": {"name": "f"}}], **chat)
        assert (status, param) == (422, "tools") and "tools are not supported" in message
        assert _error(create_chat, tool_choice="required", **chat)[:2] == (422, "tool_choice")
        assert create_chat(response_format={"type": "text"}, **chat).choices  # plain text is what it does
        # Out of range: the field named, with its range.
        status, param, message = _error(create, frequency_penalty=2.5, **comp)
        assert (status, param) == (400, "frequency_penalty") and "[-2, 2]" in message
        assert _error(create, extra_body={"repetition_penalty": 0}, **comp)[:2] == (400, "repetition_penalty")
        assert _error(create, logit_bias={"5": 101}, **comp)[:2] == (422, "logit_bias")
        assert _error(create, logit_bias={"999999": 1}, **comp)[0] == 400  # beyond the vocabulary
        # Pydantic's other errors read as sentences too.
        assert _error(create, extra_body={"frobnicate": 1}, **comp)[1:] == (
            "frobnicate", "frobnicate: not a field of this endpoint; remove it")
        r = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "max_tokens": 1})
        assert (r.status_code, r.json()["error"]["message"]) == (422, "prompt: this field is required; add it")
        assert _error(create, extra_body={"logprobs": "2"}, **comp)[:2] == (422, "logprobs")


def test_a_server_without_a_tokenizer_names_tokens_by_id(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=128, skip_tokenizer_init=True)
    with serving(create_app(llm, MODEL)) as base:
        body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, "echo": True, "logprobs": 1, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body)
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"][:3] == ["token_id:5", "token_id:6", "token_id:7"] and len(lp["tokens"]) == 5
    assert all(t.startswith("token_id:") for top in lp["top_logprobs"][1:] for t in top)


def test_penalties_and_logit_bias_are_the_engines(server, client):
    """vLLM's and OpenAI's sampling fields reach the engine: the served tokens are LLM.generate's with the
    same SamplingParams."""
    ids = server.direct.tokenizer.encode("penalised")
    fields = dict(presence_penalty=0.5, frequency_penalty=1.0, logit_bias={"13": 4.0, "20": -50})
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0.8, seed=4, logprobs=0,
                                  extra_body={"repetition_penalty": 1.3, **NO_EOS}, **fields)
    out = _engine(server.direct, ids, max_tokens=8, temperature=0.8, seed=4, logprobs=0, ignore_eos=True,
                  repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=1.0, logit_bias={13: 4.0, 20: -50})
    assert r.choices[0].logprobs.token_logprobs == out.outputs[0].logprobs.logprobs
    plain = _engine(server.direct, ids, max_tokens=8, temperature=0.8, seed=4, ignore_eos=True)
    assert out.outputs[0].token_ids != plain.outputs[0].token_ids and 20 not in out.outputs[0].token_ids
