"""pacore serve against hostile input, round two (issue 31): a request whose logprobs reply is huge
(2), stop lists (3), logprobs beyond the vocabulary (4), NaN logits (5), API keys no client can send
(9), prompt_logprobs -1 in a stream, and POSTs a web page could send (12)."""
import math
import os
import threading
import time
from types import SimpleNamespace
from unittest.mock import patch

import httpx
import openai
import pytest
from server_helpers import metrics, serving, wait_until

from engine import LLM
from engine.serve import protocol as api
from engine.serve.app import create_app

MODEL = "tiny"
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    # Past the tiny checkpoint's 1024 positions (its RoPE is llama3's), as the override allows: the tests
    # need 1000-token prompts with room after them.
    with patch.dict(os.environ, {"PACORE_ALLOW_LONG_MAX_MODEL_LEN": "1"}):
        llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=512, max_model_len=1100)
    app = create_app(llm, MODEL)
    with serving(app) as base:
        yield SimpleNamespace(base=base, llm=llm, state=app.state.server)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="none", max_retries=0)


def _error(fn, **kw):
    with pytest.raises(openai.APIStatusError) as e:
        fn(**kw)
    return e.value.status_code, e.value.body["param"], e.value.body["message"]


class _Stream:
    """Another client's stream, read on a thread: when each chunk arrived."""

    def __init__(self, client, max_tokens: int = 600, **kw):
        self.times, self.chunks, self.error = [], [], None
        self.thread = threading.Thread(target=self._read, args=(client, max_tokens, kw))
        self.thread.start()
        wait_until(lambda: len(self.times) >= 3 or self.error, "the stream to start")

    def _read(self, client, max_tokens, kw):
        try:
            for chunk in client.completions.create(model=MODEL, prompt="keep going", max_tokens=max_tokens,
                                                   stream=True, extra_body=NO_EOS, **kw):
                self.times.append(time.monotonic())
                self.chunks.append(chunk)
        except Exception as e:  # noqa: BLE001 (checked by the test)
            self.error = e

    def largest_gap(self, start: float, end: float) -> float:
        """The longest wait for a chunk between start and end (and the first chunk after end)."""
        wait_until(lambda: any(t > end for t in self.times) or not self.thread.is_alive(), "a chunk after", 120)
        window = [start] + [t for t in self.times if start < t <= end] + [min(t for t in self.times if t > end)]
        return max(b - a for a, b in zip(window, window[1:]))

    def finish(self):
        self.thread.join(timeout=300)
        assert self.error is None and self.chunks[-1].choices[0].finish_reason == "length"


# -- 2: one request with big logprobs ---------------------------------------------------------------------
def test_a_big_logprobs_reply_stalls_no_other_stream(server, client):
    # 16 choices echoing a 500-token prompt with the top 20: ~174k logprob entries. Built and serialised on
    # the event loop, this reply stopped every other stream and /health for ~7 s on this 2-core machine.
    prompt = "word " * 100
    other, probes = _Stream(client), []
    start = time.monotonic()
    reply = []
    heavy = threading.Thread(target=lambda: reply.append(client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=20, n=16, max_tokens=16, extra_body=NO_EOS)))
    heavy.start()
    while heavy.is_alive():
        sent = time.monotonic()
        assert httpx.get(f"{server.base}/health", timeout=60).status_code == 200
        probes.append(time.monotonic() - sent)
        time.sleep(0.05)
    end = time.monotonic()
    gap = other.largest_gap(start, end)
    other.finish()
    assert gap < 2.0, f"another client's stream waited {gap:.1f} s for a chunk while the big reply was built"
    assert max(probes) < 2.0, f"/health took {max(probes):.1f} s while the big reply was built"
    (r,) = reply
    assert len(r.choices) == 16
    for choice in r.choices:
        # The prompt's logprobs go out once per choice: in its logprobs, which echo begins with them.
        assert len(choice.logprobs.tokens) == len(prompt) + 16 and choice.model_extra["prompt_logprobs"] is None


def test_a_request_that_could_build_too_many_logprobs_is_refused(server, client):
    # 64 x (1,000 prompt + 16) tokens x (20 + 1): 1.37 million entries, beyond the default 1,000,000.
    status, param, message = _error(client.completions.create, model=MODEL, prompt="w" * 1000, echo=True,
                                    logprobs=20, n=64, max_tokens=16)
    assert (status, param) == (400, "logprobs") and "1365504 log-probabilities" in message
    assert "limit of 1000000" in message and "--max-logprob-entries" in message
    status, param, message = _error(client.chat.completions.create, model=MODEL, n=64, max_tokens=1000,
                                    messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=20)
    assert (status, param) == (400, "top_logprobs") and "--max-logprob-entries" in message
    # Chat without max_tokens may fill the context: that is what is counted.
    status, param, message = _error(client.chat.completions.create, model=MODEL, n=64,
                                    messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=20)
    assert (status, param) == (400, "top_logprobs")
    assert metrics(server.base)["pacore_queued_sequences"] == 0


# -- 3: stop lists ---------------------------------------------------------------------------------------
def test_a_stop_list_beyond_the_limits_is_a_400_naming_the_flags(server, client, monkeypatch):
    create = client.completions.create
    status, param, message = _error(create, model=MODEL, prompt="x", max_tokens=2, stop=[f"s{i}" for i in range(65)])
    assert (status, param) == (400, "stop") and "65 strings" in message and "--max-stop-strings" in message
    status, param, message = _error(create, model=MODEL, prompt="x", max_tokens=2, stop=["a" * 600, "b" * 600])
    assert (status, param) == (400, "stop") and "1200 characters" in message and "--max-stop-chars" in message
    assert create(model=MODEL, prompt="x", max_tokens=2, stop=[f"s{i}" for i in range(64)]).choices
    monkeypatch.setattr(server.state, "limits", api.Limits(20, max_stop_strings=4, max_stop_chars=1024))
    assert _error(create, model=MODEL, prompt="x", max_tokens=2, stop=list("abcde"))[:2] == (400, "stop")
    assert create(model=MODEL, prompt="x", max_tokens=2, stop=list("abcd")).choices  # OpenAI's 4


# -- 4: logprobs beyond the vocabulary -----------------------------------------------------------------------
def test_max_logprobs_above_the_vocabulary_stops_the_server_at_start(tiny_model_dir, monkeypatch, capsys):
    import uvicorn

    from pacore.cli import main
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the server started"))
    assert main(["serve", "--model", str(tiny_model_dir("llama")), "--max-logprobs", "300"]) == 2
    err = capsys.readouterr().err
    assert "max_logprobs=300 (--max-logprobs) is above the model's vocabulary of 256 tokens" in err


def test_logprobs_above_the_vocabulary_are_a_400_and_others_go_on(server, client, monkeypatch):
    # An engine configured before the start-up check: the request is refused, not the step it would run in.
    monkeypatch.setattr(server.llm.options, "max_logprobs", 1000)
    monkeypatch.setattr(server.state, "limits", api.Limits(1000))
    other = _Stream(client, max_tokens=200)
    status, _, message = _error(client.completions.create, model=MODEL, prompt="x", max_tokens=2, logprobs=300)
    assert status == 400 and "above the model's vocabulary of 256 tokens" in message
    other.finish()


# -- 5: NaN logits -----------------------------------------------------------------------------------------
POISONED = [7, 7, 7, 7, 9]  # the prompt whose rows the model computes as NaN


def _poison(server, monkeypatch):
    run = server.llm.runner.run

    def poisoned(plan):
        logits, scored = run(plan)
        logits = logits.clone()
        for i, seq in enumerate(plan.sample_seqs):
            if seq.request.prompt_token_ids == POISONED and seq.num_generated >= 2:
                logits[i, 3] = math.nan
        return logits, scored
    monkeypatch.setattr(server.llm.runner, "run", poisoned)


@pytest.mark.parametrize("stream", [False, True])
def test_nan_logits_fail_their_request_alone_with_a_clear_error(server, client, monkeypatch, stream):
    _poison(server, monkeypatch)
    before = metrics(server.base).get("pacore_requests_total{endpoint=completions,outcome=error}", 0)
    other = _Stream(client, max_tokens=200, logprobs=1)
    kw = dict(model=MODEL, prompt=POISONED, max_tokens=50, logprobs=2, extra_body=NO_EOS)
    if stream:  # after the 200: an error event inside the stream, as vLLM
        with pytest.raises(openai.APIError) as e:
            for _ in client.completions.create(stream=True, **kw):
                pass
        message = e.value.message
    else:
        status, _, message = _error(client.completions.create, **kw)
        assert status == 500
    assert "non-finite logits (NaN or inf)" in message and "aborted" in message
    other.finish()
    assert all(lp is not None for c in other.chunks for ch in c.choices if ch.logprobs
               for lp in ch.logprobs.token_logprobs)
    wait_until(lambda: metrics(server.base)["pacore_requests_total{endpoint=completions,outcome=error}"] == before + 1,
               "the failure to be counted")


# -- 9: API keys -------------------------------------------------------------------------------------------
def test_an_api_key_is_stripped_as_clients_send_it(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=64)
    with serving(create_app(llm, MODEL, api_key=" secret\n")) as base:  # as read from an env file
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="secret", max_retries=0)
        assert client.completions.create(model=MODEL, prompt="x", max_tokens=1).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize("key", ["s\u00e9cret", "sec\x00ret", "se\tcret", "\u5bc6\u94a5"])
def test_an_api_key_no_client_can_send_is_refused_at_start(tiny_model_dir, monkeypatch, capsys, key):
    import uvicorn

    import engine
    from pacore.cli import main
    monkeypatch.setattr(engine, "LLM", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the server started"))
    assert main(["serve", "--api-key", key]) == 2
    assert "no client can send in an HTTP header" in capsys.readouterr().err
    with pytest.raises(ValueError, match="printable ASCII"):
        create_app(LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=64), MODEL, api_key=key)


# -- 12: prompt_logprobs -1 in a stream; POSTs a web page could send -----------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_prompt_logprobs_minus_one_is_a_400_streaming_or_not(client, stream):
    status, param, message = _error(client.completions.create, model=MODEL, prompt="x", max_tokens=1, stream=stream,
                                    extra_body={"prompt_logprobs": -1})
    assert (status, param) == (400, "prompt_logprobs") and "[0, 20]" in message


def test_a_post_must_say_it_is_json_so_a_web_page_cannot_send_one_unasked(server):
    body = b'{"model": "tiny", "prompt": "x", "max_tokens": 1}'
    for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}):
        # What a page's fetch() or form sends to any origin without a preflight; none is served.
        r = httpx.post(f"{server.base}/v1/completions", content=body, headers={"Origin": "http://evil.example",
                                                                               **headers})
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]["message"], headers
    # The JSON one needs a preflight, which a server without --allowed-origins does not grant.
    r = httpx.options(f"{server.base}/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.post(f"{server.base}/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200


def test_allowed_origins_let_those_pages_call_the_api(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=64)
    with serving(create_app(llm, MODEL, api_key="k", allowed_origins=["http://localhost:3000"])) as base:
        ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
        r = httpx.options(f"{base}/v1/completions", headers={"Origin": "http://localhost:3000", **ask})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = httpx.options(f"{base}/v1/completions", headers={"Origin": "http://evil.example", **ask})
        assert "access-control-allow-origin" not in r.headers
        r = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                       headers={"Origin": "http://localhost:3000", "Authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
