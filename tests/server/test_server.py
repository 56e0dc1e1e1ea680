"""pacore serve, driven over HTTP by the real openai client: chat and completions, n > 1, streams,
seeds, stop strings, disconnects, and the error statuses (400, 401, 404, 422, 429, 500)."""
import json
import re
import shlex
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from server_helpers import metrics, serving, wait_until

from engine import LLM, SamplingParams
from pacore.cli import build_parser
from engine.serve.app import create_app

KEY, MODEL, ALIAS = "test-key", "tiny", "default"  # ALIAS: as `pacore serve --model default` passes it
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=256, max_model_len=512)
    app = create_app(llm, MODEL, api_key=KEY, max_queue=8, aliases=(ALIAS,))
    with serving(app) as base:
        yield SimpleNamespace(base=base, llm=llm, state=app.state.server)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)


def _post(server, path, content, key=KEY):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return httpx.post(f"{server.base}{path}", content=content, headers=headers)


def test_the_name_it_was_started_with_is_answered_too(server, client):
    # issue 28: a server started with --model default served smollm2-135m and answered "default" with 404
    reply = client.completions.create(model=ALIAS, prompt="x", max_tokens=1)
    assert reply.model == MODEL and [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="tiny2", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert f"serves `{MODEL}`" in e.value.message


def test_models_health_and_metrics(server, client):
    (model,) = client.models.list().data
    assert model.id == MODEL and model.model_extra["max_model_len"] == 512
    assert httpx.get(f"{server.base}/health").status_code == 200
    client.completions.create(model=MODEL, prompt="x", max_tokens=1)
    names = {name.partition("{")[0] for name in metrics(server.base)}
    assert {"pacore_requests_total", "pacore_prompt_tokens_total", "pacore_completion_tokens_total",  # docs/serving.md's
            "pacore_http_requests_in_flight", "pacore_queued_sequences", "pacore_prefill_tokens_total", "pacore_decode_tokens_total",
            "pacore_prefix_cache_hit_tokens_total", "pacore_cascade_decode_steps_total", "pacore_engine_steps_total",
            "pacore_preemptions_total", "pacore_kv_blocks_used", "pacore_kv_blocks_shared", "pacore_kv_blocks_total",
            "pacore_num_sequences_waiting", "pacore_num_sequences_running", "pacore_num_requests_in_engine",
            "pacore_prefill_tokens_per_second", "pacore_decode_tokens_per_second"} <= names


def test_chat_renders_the_models_template_like_the_engine(server, client, tiny_model_dir):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+2?"}]}]
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=12)
    rendered = "<system>Be brief.\n<user>What is\n2+2?\n<assistant>"  # the tiny tokenizer: one token a character
    direct = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=512)
    expected = direct.generate([direct.tokenizer.encode(rendered)], SamplingParams(temperature=0, max_tokens=12),
                               use_tqdm=False)[0].outputs[0]
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(rendered), len(expected.token_ids))


def test_n4_is_one_fork_and_usage_counts_the_prompt_once(server, client):
    prompt = "Only this test sends this prompt; it spans a few KV blocks. " * 2
    before = metrics(server.base)
    r = client.completions.create(model=MODEL, prompt=prompt, n=4, max_tokens=5, seed=7, extra_body=NO_EOS)
    after = metrics(server.base)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3] and len({c.text for c in r.choices}) > 1
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), 4 * 5)
    assert after["pacore_prefill_tokens_total"] - before["pacore_prefill_tokens_total"] == len(prompt)
    assert after["pacore_prompt_tokens_total"] - before["pacore_prompt_tokens_total"] == len(prompt)
    assert after["pacore_completion_tokens_total"] - before["pacore_completion_tokens_total"] == 20


def test_max_tokens_defaults_and_a_batch_of_prompts(server, client, tiny_model_dir):
    r = client.completions.create(model=MODEL, prompt="x", extra_body=NO_EOS)  # completions: 16, as OpenAI
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (16, "length")
    messages = [{"role": "user", "content": "y" * 400}]
    r = client.chat.completions.create(model=MODEL, messages=messages, extra_body=NO_EOS)  # chat: the rest of the context
    assert r.usage.total_tokens == 512 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=3, max_tokens=7,
                                       extra_body=NO_EOS)
    assert r.usage.completion_tokens == 3
    # A batch of n=2: choices prompt by prompt (index = prompt * n + child), each prompt counted once.
    prompts, greedy = [[5, 6, 7], [40, 41, 42, 43, 44]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    direct = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=512)
    alone = [o.outputs[0] for o in direct.generate(prompts, greedy, use_tqdm=False)]
    r = client.completions.create(model=MODEL, prompt=prompts, n=2, temperature=0, max_tokens=4, extra_body=NO_EOS)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [alone[0].text] * 2 + [alone[1].text] * 2
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (8, 16)
    # vLLM's top_k, min_p (1 of each is greedy) and stop_token_ids (a greedy token ends the choice there).
    one = dict(model=MODEL, prompt=prompts[1], max_tokens=4, temperature=1.0)
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        assert client.completions.create(**one, extra_body={**NO_EOS, **extra}).choices[0].text == alone[1].text
    last = alone[1].token_ids[-1]
    r = client.completions.create(**{**one, "temperature": 0}, extra_body={**NO_EOS, "stop_token_ids": [last]})
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("stop", alone[1].token_ids.index(last) + 1)


def test_the_rate_window_keeps_only_its_last_seconds_when_nobody_scrapes(server, client, monkeypatch):
    import itertools

    from engine.serve import engine_loop
    clock = itertools.count(10 ** 6, engine_loop.RATE_WINDOW_S + 1)  # every step ends past the last one's window
    monkeypatch.setattr(engine_loop, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    client.completions.create(model=MODEL, prompt="x", max_tokens=8, extra_body=NO_EOS)  # 8 steps, no /metrics
    assert len(server.state.engine._recent) <= 1  # one entry per step forever was a leak


def test_seeded_requests_reproduce(client):
    def texts(seed):
        r = client.completions.create(model=MODEL, prompt="seeded", n=2, max_tokens=8, seed=seed, extra_body=NO_EOS)
        return [c.text for c in r.choices]
    assert texts(11) == texts(11) != texts(12)


def _streamed(stream, order=None):
    texts, reasons, usage, roles = {}, {}, None, set()
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            if order is not None:
                order.append((c.index, c.finish_reason))
            piece = c.delta.content if hasattr(c, "delta") else c.text
            if hasattr(c, "delta") and c.delta.role:
                roles.add(c.index)
            texts[c.index] = texts.get(c.index, "") + (piece or "")
            if c.finish_reason:
                assert c.index not in reasons, "one final chunk per choice"
                reasons[c.index] = c.finish_reason
    return texts, reasons, usage, roles


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_stream_ends_with_the_non_streaming_text_and_stops_before_a_stop_string(client, endpoint):
    if endpoint == "chat":
        create, prompt = client.chat.completions.create, {"messages": [{"role": "user", "content": "Stream me."}]}
        text_of = lambda c: c.message.content  # noqa: E731
    else:
        create, prompt = client.completions.create, {"prompt": "Stream me."}
        text_of = lambda c: c.text  # noqa: E731
    kw = dict(model=MODEL, n=3, max_tokens=24, temperature=1.0, seed=5, extra_body=NO_EOS, **prompt)
    free = [text_of(c) for c in sorted(create(**kw).choices, key=lambda c: c.index)]
    stop = free[0][10:12]  # choice 0 wrote it, so choice 0 must stop right before its first occurrence
    full = create(stop=[stop], **kw)
    order = []
    streamed, reasons, usage, roles = _streamed(create(stop=[stop], stream=True, stream_options={"include_usage": True},
                                                       **kw), order)
    assert streamed == {c.index: text_of(c) for c in full.choices}
    assert reasons == {c.index: c.finish_reason for c in full.choices}
    assert streamed[0] == free[0][:free[0].find(stop)] and reasons[0] == "stop"
    assert usage.model_dump() == full.usage.model_dump()
    assert roles == ({0, 1, 2} if endpoint == "chat" else set())
    # Choice 0 stopped early: its final chunk comes then, while its siblings still stream.
    assert order.index((0, "stop")) < max(i for i, (index, reason) in enumerate(order) if index != 0 and not reason)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_raw_event_stream(server, endpoint, monkeypatch):
    import itertools

    from engine.serve import protocol
    clock = SimpleNamespace(time=itertools.count(1_000_000).__next__)  # a second passes at every reading
    monkeypatch.setattr(protocol, "time", clock)
    body = {"model": MODEL, "n": 2, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True},
            **NO_EOS, **({"messages": [{"role": "user", "content": "x"}]} if endpoint == "chat" else {"prompt": "x"})}
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    r = _post(server, path, json.dumps(body).encode())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = r.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: ") for e in events[:-1])
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    kind = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    assert {(c["object"], c["id"], c["model"]) for c in chunks} == {(kind, chunks[0]["id"], MODEL)}
    assert chunks[0]["id"].startswith("chatcmpl-" if endpoint == "chat" else "cmpl-")
    assert len({c["created"] for c in chunks}) == 1  # OpenAI: every chunk of a stream has the same timestamp
    assert [c["choices"] for c in chunks[-1:]] == [[]] and chunks[-1]["usage"]["completion_tokens"] == 2 * 3
    assert all(len(c["choices"]) == 1 and c["usage"] is None for c in chunks[:-1])
    finals = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(f["index"] for f in finals) == [0, 1] and {f["finish_reason"] for f in finals} == {"length"}


def test_a_client_that_disconnects_from_a_stream_frees_its_blocks(server, client):
    before = metrics(server.base)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Go on and on."}],
                                            max_tokens=480, stream=True, extra_body=NO_EOS)
    chunks = iter(stream)
    next(chunks), next(chunks)  # the role chunk, then generated text: blocks are held
    assert metrics(server.base)["pacore_kv_blocks_used"] > 0
    stream.close()
    aborted = "pacore_requests_total{endpoint=chat,outcome=aborted}"
    wait_until(lambda: (m := metrics(server.base))[aborted] == before.get(aborted, 0) + 1
               and m["pacore_kv_blocks_used"] == 0, "the abort to free the blocks")


def test_a_client_that_disconnects_before_the_reply_frees_its_blocks(server):
    before = metrics(server.base)
    body = json.dumps({"model": MODEL, "prompt": "Never read.", "max_tokens": 480, "ignore_eos": True}).encode()
    host, port = server.base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    wait_until(lambda: metrics(server.base)["pacore_kv_blocks_used"] > 0, "the request to run")
    sock.close()
    aborted = "pacore_requests_total{endpoint=completions,outcome=aborted}"
    wait_until(lambda: (m := metrics(server.base)).get(aborted) == before.get(aborted, 0) + 1
               and m["pacore_kv_blocks_used"] == 0 and m["pacore_http_requests_in_flight"] == 0,
               "the abort to free the blocks")


def test_refusals_are_openai_errors(server, client):
    with pytest.raises(openai.BadRequestError) as e:  # prompt + max_tokens beyond the context
        client.completions.create(model=MODEL, prompt="x" * 100, max_tokens=500)
    assert "maximum context length is 512" in e.value.message and "reduce the length" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # more trajectories than the KV cache has blocks
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, n=300)
    assert "n=300" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", top_p=2.0)
    assert e.value.body["param"] == "top_p"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="another-model", prompt="x")
    with pytest.raises(openai.UnprocessableEntityError) as e:  # unknown fields are named, not ignored
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       extra_body={"frobnicate": 1})
    assert e.value.body["param"] == "frobnicate" and "frobnicate" in e.value.message
    with pytest.raises(openai.UnprocessableEntityError) as e:  # no tool calling: named, not ignored
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    assert e.value.body["param"] == "tools" and "not supported" in e.value.message
    r = _post(server, "/v1/chat/completions", b'{"model": "tiny", "messages": [')
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "malformed JSON" in r.json()["error"]["message"]
    # Not UTF-8, so not JSON either: an OpenAI error body too, not FastAPI's {"detail": ...}.
    r = _post(server, "/v1/completions", b'{"model": "tiny", "prompt": "a\xff"}')
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    for method, path, status in (("GET", "/v1/nowhere", 404), ("GET", "/v1/completions", 405)):
        r = httpx.request(method, f"{server.base}{path}", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == status and r.json()["error"]["code"] == status
    # A lone surrogate is no text: refused in any field (issue 22: the model's was a 404), and the
    # error that names it still renders.
    r = _post(server, "/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b", "max_tokens": 1}')
    assert r.status_code == 400 and "not valid Unicode" in r.json()["error"]["message"]
    r = _post(server, "/v1/completions", b'{"model": "ti\\ud800ny", "prompt": "x", "max_tokens": 1}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    # top_k past int64 failed the sampler, so the whole step (every request in it) with 500.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body={"top_k": 2 ** 63})
    assert e.value.body["param"] == "top_k"


def test_the_api_key_is_required(server):
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
    for key in (None, "wrong"):
        r = _post(server, "/v1/completions", body, key=key)
        assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{server.base}/health").status_code == 200  # health and metrics stay open


def test_a_full_queue_answers_429(server, client, monkeypatch):
    gate, step = threading.Event(), server.llm.step
    monkeypatch.setattr(server.llm, "step", lambda: (gate.wait(), step())[1])  # hold the engine
    monkeypatch.setattr(server.state, "max_queue", 1)
    held = []
    thread = threading.Thread(target=lambda: held.append(client.completions.create(model=MODEL, prompt="held",
                                                                                   max_tokens=2)))
    thread.start()
    try:
        wait_until(lambda: metrics(server.base)["pacore_http_requests_in_flight"] == 1, "the first request")
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=MODEL, prompt="one too many", max_tokens=2)
        assert e.value.status_code == 429 and "--max-queue" in e.value.message
    finally:
        gate.set()
        thread.join()
    assert held[0].choices[0].finish_reason in ("stop", "length")


def test_a_failed_step_fails_its_request_with_500_and_the_server_goes_on(server, client, monkeypatch):
    run, failed = server.llm.runner.run, []

    def fail_once(plan):
        if not failed:
            failed.append(plan)
            raise RuntimeError("injected device error")
        return run(plan)
    monkeypatch.setattr(server.llm.runner, "run", fail_once)
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=MODEL, prompt="unlucky", max_tokens=3)
    assert e.value.status_code == 500 and "injected device error" in e.value.message
    r = client.completions.create(model=MODEL, prompt="lucky", max_tokens=3, extra_body=NO_EOS)
    assert r.choices[0].finish_reason == "length"
    assert metrics(server.base)["pacore_kv_blocks_used"] == 0


def test_a_server_without_a_tokenizer_streams_token_id_prompts_and_refuses_what_the_cache_cannot_hold(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=4, max_model_len=256, skip_tokenizer_init=True)
    with serving(create_app(llm, MODEL)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        kw = dict(model=MODEL, prompt=[1, 2, 3], max_tokens=4, n=2, seed=1, extra_body=NO_EOS)
        # The stream once crashed the engine thread (decoding with no tokenizer): every later request got 503.
        stream = client.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
        texts, reasons, usage, _ = _streamed(stream)
        full = client.completions.create(**kw)
        assert texts == {0: "", 1: ""} == {c.index: c.text for c in full.choices}
        assert reasons == {0: "length", 1: "length"} and usage.model_dump() == full.usage.model_dump()
        assert httpx.get(f"{base}/health").status_code == 200
        with pytest.raises(openai.BadRequestError) as e:  # 100 tokens fit max_model_len, not 4 blocks of 16
            client.completions.create(model=MODEL, prompt=[1] * 10, max_tokens=90)
        assert "whole KV cache" in e.value.message


@pytest.mark.parametrize("how", ["closed", "crashed"])
def test_an_engine_that_is_gone_answers_503_and_nobody_hangs(tiny_model_dir, how):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=128)
    app = create_app(llm, MODEL)
    with serving(app) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        if how == "closed":
            app.state.server.engine.close()
        else:  # a bug in the step loop (not a failed step): the request in flight fails, the thread ends
            llm.step = lambda: 1 / 0
            with pytest.raises(openai.InternalServerError) as e:
                client.completions.create(model=MODEL, prompt="x", max_tokens=1)
            assert e.value.status_code == 503 and "ZeroDivisionError" in e.value.message
        assert httpx.get(f"{base}/health").status_code == 503
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert e.value.status_code == 503


def test_the_documented_serve_commands_parse():
    section = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text().split("## Start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert [c[1] for c in commands] == ["serve", "serve"]
    default, pacore8b = (build_parser().parse_args(c[1:]) for c in commands)
    assert default.model == "default" and (default.host, default.port) == ("127.0.0.1", 8000)
    assert pacore8b.served_model_name == "pacore-8b" and pacore8b.max_model_len == 131072
    assert pacore8b.rope_scaling["attention_factor"] == 1.0


def test_serve_flags_reach_the_engine_and_the_app(monkeypatch, capsys):
    import engine

    from pacore.cli import main
    from engine.serve import app as serve_app
    from engine.serve import connection
    seen = {}

    class FakeLLM:
        def __init__(self, model, **options):
            seen["model"], seen["options"] = model, options

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def describe(self):
            return "engine: the fake model, its KV cache and context"
    monkeypatch.setattr(engine, "LLM", FakeLLM)
    monkeypatch.setattr(serve_app, "create_app", lambda llm, name, key, queue, body, **kw: seen.update(
        app=(name, key, queue), body=body, aliases=kw["aliases"], origins=kw["allowed_origins"],
        limits=(kw["max_logprob_entries"], kw["max_stop_strings"], kw["max_stop_chars"])))
    monkeypatch.setattr(connection, "serve", lambda app, drain_s, host, port, **kw: seen.update(
        bind=(host, port), drain=drain_s, uvicorn=kw))
    monkeypatch.setenv("PACORE_API_KEY", "from-env")
    assert main(["serve", "--model", "/m/PaCoRe-8B/", "--dtype", "bfloat16", "--max-model-len", "64",
                 "--rope-scaling", '{"factor": 2.0}', "--max-num-seqs", "3", "--num-kv-blocks", "9",
                 "--tensor-parallel", "2", "--batch-invariant", "--enforce-eager", "--seed", "5", "--port", "9",
                 "--max-logprobs", "5", "--logprobs-mode", "processed_logprobs"]) == 0
    assert seen["model"] == "/m/PaCoRe-8B/" and seen["options"] == dict(
        seed=5, dtype="bfloat16", max_model_len=64, rope_scaling={"factor": 2.0}, max_num_seqs=3, num_kv_blocks=9,
        batch_invariant=True, tensor_parallel_size=2, enforce_eager=True, max_logprobs=5,
        logprobs_mode="processed_logprobs")
    assert seen["app"] == ("PaCoRe-8B", "from-env", 1024) and seen["bind"] == ("127.0.0.1", 9)
    assert seen["aliases"] == ("/m/PaCoRe-8B/",)  # the name it was started with is answered too
    # one start-up line on stderr: the engine's description and the names it answers
    assert capsys.readouterr().err.splitlines()[0] == ("engine: the fake model, its KV cache and context; "
                                                       "served as PaCoRe-8B (or /m/PaCoRe-8B/)")
    assert seen["body"] == 32 * 2 ** 20 and seen["drain"] == 30.0
    assert seen["uvicorn"]["log_level"] == "info" and seen["uvicorn"]["access_log"]
    assert seen["limits"] == (1_000_000, 64, 1024) and seen["origins"] is None
    assert main(["serve", "--served-model-name", "x", "--api-key", "k", "--max-queue", "2", "--max-body-bytes", "7",
                 "--shutdown-timeout", "0.5", "--max-logprob-entries", "9", "--max-stop-strings", "4",
                 "--max-stop-chars", "30", "--allowed-origins", '["http://localhost:3000"]']) == 0
    assert seen["model"] is None and seen["app"] == ("x", "k", 2) and seen["body"] == 7
    assert seen["limits"] == (9, 4, 30) and seen["origins"] == ["http://localhost:3000"]
    assert seen["drain"] == 0.5
    assert main(["serve"]) == 0 and seen["app"][0] == "smollm2-135m" and seen["aliases"] == ("default",)


def test_vllms_logging_and_capture_flags_are_taken_with_their_meaning_or_named_as_no_ops(monkeypatch, capsys):
    import engine
    from engine.serve import app as serve_app
    from engine.serve import connection
    from pacore.cli import main
    seen = {}

    class FakeLLM:
        def __init__(self, model, **options):
            seen["options"] = options
        __enter__ = lambda self: self  # noqa: E731
        __exit__ = lambda self, *exc: None  # noqa: E731
        describe = lambda self: "engine: fake"  # noqa: E731
    monkeypatch.setattr(engine, "LLM", FakeLLM)
    monkeypatch.setattr(serve_app, "create_app", lambda *a, **kw: seen.update(app=kw))
    monkeypatch.setattr(connection, "serve", lambda app, drain_s, host, port, **kw: seen.update(uvicorn=kw))
    assert main(["serve", "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log", "--max-log-len", "100",
                 "--max-seq-len-to-capture", "8192", "--disable-custom-all-reduce",
                 "--enable-prompt-tokens-details"]) == 0
    assert seen["uvicorn"] == {"log_level": "warning", "access_log": False}
    assert seen["app"]["prompt_tokens_details"] is True
    line = capsys.readouterr().err.splitlines()[0]
    assert "taken without effect: " in line and "--max-log-len (" in line and "--max-seq-len-to-capture (" in line, line
    assert "--disable-custom-all-reduce (" in line and "--uvicorn-log-level" not in line, line


def test_serve_without_the_extra_names_the_install_command(monkeypatch, capsys):
    import sys

    from pacore.cli import main
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if not installed
    assert main(["serve", "--model", "default"]) == 2
    assert "pip install -e '.[serve]'" in capsys.readouterr().err
