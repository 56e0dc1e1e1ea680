"""Speculative decoding behind the server, with the real openai client: a verified row appends several
tokens in one step, so a stream's chunk may carry several tokens of a choice. Streamed and non-streamed
replies are equal, text and logprobs, and are the tokens the engine decodes without speculation
(greedy); /metrics counts the drafts under vLLM's names.
"""
from types import SimpleNamespace

import openai
import pytest
from server_helpers import metrics, serving

from engine import LLM, SamplingParams
from engine.chat import chat_prompt_ids
from engine.serve.app import create_app
from engine.serve.metrics import ServerMetrics

MODEL = "tiny-spec"
NO_EOS = {"ignore_eos": True}
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    folder = str(tiny_model_dir("qwen3_sharp"))  # peaked distributions: drafts are often right
    llm = LLM(folder, num_kv_blocks=256, max_model_len=512, speculative_config=SPEC)
    with serving(create_app(llm, MODEL)) as base:
        yield SimpleNamespace(base=base, llm=llm, plain=LLM(folder, num_kv_blocks=256, max_model_len=512))


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0)


def _accepted(server) -> int:
    return server.llm.stats()["spec_decode_num_accepted_tokens"]


def _plain(server, prompt_ids, **params):
    """The engine's reply without speculation."""
    return server.plain.generate([prompt_ids], SamplingParams(**params), use_tqdm=False)[0]


def test_a_completions_stream_equals_the_reply_and_the_tokens_without_speculation(server, client):
    prompt = "abcabcabcabc"
    kw = dict(model=MODEL, prompt=prompt, n=2, temperature=0, max_tokens=40, logprobs=2, extra_body=NO_EOS)
    before = _accepted(server)
    free = client.completions.create(**kw)
    assert _accepted(server) > before  # the reply came out of verify steps that accepted drafts
    plain = _plain(server, server.llm.tokenizer.encode(prompt), n=2, temperature=0, max_tokens=40, ignore_eos=True,
                   logprobs=2)
    for choice in free.choices:
        expected = plain.outputs[choice.index]
        assert choice.text == expected.text and len(choice.logprobs.tokens) == 40
        assert choice.logprobs.token_logprobs == pytest.approx(expected.logprobs.logprobs, abs=1e-4)
    # A stop string that ends inside the reply: the stream holds back what may be one, as without drafts.
    stop = free.choices[0].text[17:19]
    full = client.completions.create(stop=[stop], **kw)
    cut = free.choices[0].text[:free.choices[0].text.find(stop)]
    assert [c.text for c in full.choices] == [cut, cut] and {c.finish_reason for c in full.choices} == {"stop"}
    chunks: dict[int, list] = {}
    for chunk in client.completions.create(stop=[stop], stream=True, **kw):
        for c in chunk.choices:
            chunks.setdefault(c.index, []).append(c)
    for choice in full.choices:
        mine = chunks[choice.index]
        assert "".join(c.text for c in mine) == choice.text
        assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]
        served = [lp for c in mine if c.logprobs for lp in zip(c.logprobs.tokens, c.logprobs.token_logprobs,
                                                               c.logprobs.top_logprobs)]
        assert served == list(zip(choice.logprobs.tokens, choice.logprobs.token_logprobs,
                                  choice.logprobs.top_logprobs))
    # some chunk carried several tokens of one choice (a verified run, or a reader that lagged)
    assert any(c.logprobs and len(c.logprobs.tokens) > 1 for mine in chunks.values() for c in mine)


def test_a_chat_stream_equals_the_reply_and_the_tokens_without_speculation(server, client):
    messages = [{"role": "user", "content": "xyzxyzxyzxyz"}]
    kw = dict(model=MODEL, messages=messages, n=3, temperature=0, max_tokens=36, logprobs=True, top_logprobs=2,
              extra_body=NO_EOS)
    before = _accepted(server)
    full = client.chat.completions.create(**kw)
    plain = _plain(server, chat_prompt_ids(server.plain.tokenizer, messages), n=3, temperature=0, max_tokens=36,
                   ignore_eos=True, logprobs=2)
    text, content, usage = {}, {}, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + (c.delta.content or "")
            content.setdefault(c.index, []).extend(c.logprobs.content if c.logprobs else [])
        usage = chunk.usage or usage
    assert _accepted(server) > before
    for choice in full.choices:
        expected = plain.outputs[choice.index]
        assert choice.message.content == text[choice.index] == expected.text
        assert [c.model_dump() for c in content[choice.index]] == [c.model_dump() for c in choice.logprobs.content]
        assert [c.logprob for c in choice.logprobs.content] == pytest.approx(expected.logprobs.logprobs, abs=1e-4)
    assert usage.completion_tokens == full.usage.completion_tokens == 3 * 36


def test_seeded_samples_stream_as_they_are_replied(server, client):
    kw = dict(model=MODEL, prompt="seeded seeded seeded", n=4, temperature=1.0, seed=7, max_tokens=30,
              extra_body=NO_EOS)
    full = client.completions.create(**kw)
    texts = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in full.choices}


def test_metrics_count_the_drafts_under_vllms_names(server, client):
    client.completions.create(model=MODEL, prompt="metrics metrics metrics", max_tokens=20, temperature=0,
                              extra_body=NO_EOS)
    served, stats = metrics(server.base), server.llm.stats()
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert served[f"pacore_spec_decode_{name}_total"] == stats[f"spec_decode_{name}"] > 0
        assert served[f"vllm:spec_decode_{name}_total{{model_name={MODEL}}}"] == stats[f"spec_decode_{name}"]
    per_pos = [served[f"pacore_spec_decode_num_accepted_tokens_per_pos_total{{position={j}}}"]
               for j in range(SPEC["num_speculative_tokens"])]
    assert per_pos == stats["spec_decode_num_accepted_tokens_per_pos"]
    assert per_pos == [served[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name={MODEL},position={j}}}"]
                       for j in range(SPEC["num_speculative_tokens"])]
    assert sum(per_pos) == stats["spec_decode_num_accepted_tokens"] and per_pos[0] >= per_pos[-1]
    # an engine without speculation exposes none of them
    engine = SimpleNamespace(latest_stats=server.plain.stats() | {"num_requests": 0}, rates=lambda: (0.0, 0.0))
    plain = ServerMetrics(engine)
    assert b"pacore_prefill_tokens" in plain.render() and b"spec_decode" not in plain.render()
