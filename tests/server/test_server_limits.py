"""pacore serve against hostile input and load (issue 22): the front door (key before body, body
limit, strict types), prompts that must not stall other streams, a queue that counts sequences,
slow and half-closed readers, and a bounded drain on SIGTERM."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
from server_helpers import metrics, serving, wait_until

from engine import LLM
from engine.serve.app import create_app

KEY = "limits-key"
# A long served name makes every stream chunk ~12 KB: a few hundred tokens overflow the sockets' buffers.
MODEL = "tiny-" + "m" * 12000
BODY_LIMIT = 8 * 2 ** 20
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=256, max_model_len=512)
    app = create_app(llm, MODEL, api_key=KEY, max_queue=64, max_body_bytes=BODY_LIMIT)
    with serving(app) as base:
        host, port = base.removeprefix("http://").split(":")
        yield SimpleNamespace(base=base, llm=llm, state=app.state.server, addr=(host, int(port)))


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)


def _raw(server, head: bytes, body: bytes = b"", rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(server.addr)
    sock.settimeout(15)
    sock.sendall(head + b"\r\n" + body)
    return sock


def _head(path: str, length: int | None, key: str | None = KEY, extra: bytes = b"") -> bytes:
    lines = [b"POST %s HTTP/1.1" % path.encode(), b"Host: x", b"Content-Type: application/json"]
    if key:
        lines.append(b"Authorization: Bearer " + key.encode())
    lines.append(b"Content-Length: %d" % length if length is not None else b"Transfer-Encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n" + extra


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:  # a server that stops reading a refused body may reset after its reply
        pass
    return out


def _body(**kw) -> dict:
    return {"model": MODEL, **kw}


def _post(server, path, body, key=KEY, content_type="application/json"):
    headers = {**({"Content-Type": content_type} if content_type else {}),
               **({"Authorization": f"Bearer {key}"} if key else {})}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.base}{path}", content=content, headers=headers, timeout=60)


# -- 8: the front door -----------------------------------------------------------------------------
def test_the_key_is_checked_before_the_body_is_read(server):
    # A gigabyte announced, a kilobyte sent, no key: the 401 comes at once (the body was read first).
    sock = _raw(server, _head("/v1/completions", 10 ** 9, key=None), b"x" * 1024)
    reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 401") and b"authentication_error" in reply
    sock = _raw(server, _head("/v1/completions", 10 ** 9, key="wrong"), b"x" * 1024)
    assert _read_all(sock).startswith(b"HTTP/1.1 401")


def test_a_body_beyond_the_limit_gets_413_without_being_read(server):
    sock = _raw(server, _head("/v1/completions", BODY_LIMIT + 1), b"x" * 1024)  # announced
    reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 413") and b"--max-body-bytes" in reply
    sock = _raw(server, _head("/v1/completions", None))  # chunked: counted as it arrives
    piece = b"x" * 2 ** 20
    try:
        for _ in range(BODY_LIMIT // len(piece) + 1):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    except (BrokenPipeError, ConnectionResetError):  # refused mid-body: the server closed
        pass
    assert _read_all(sock).startswith(b"HTTP/1.1 413")
    # Just under the limit is read and answered.
    prompt = "x" * 16
    body = json.dumps(_body(prompt=prompt, max_tokens=1, user="u" * (BODY_LIMIT - 200 - len(MODEL)))).encode()
    assert len(body) < BODY_LIMIT and _post(server, "/v1/completions", body).status_code == 200


def test_the_key_guards_the_v1_routes_only_as_vllm(server):
    assert httpx.get(f"{server.base}/v1/models").status_code == 401
    for path in ("/health", "/metrics", "/docs", "/openapi.json"):  # open, as vLLM's
        assert httpx.get(f"{server.base}{path}").status_code == 200, path


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_empty_api_key_is_refused_at_startup(monkeypatch, capsys, how):
    import uvicorn

    import engine
    from pacore.cli import main
    started = []
    monkeypatch.setattr(engine, "LLM", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: started.append(a))
    if how == "flag":
        argv = ["serve", "--api-key", ""]
    else:
        monkeypatch.setenv("PACORE_API_KEY", "")
        argv = ["serve"]
    assert main(argv) == 2 and not started
    assert "API key is empty" in capsys.readouterr().err


def test_create_app_refuses_an_empty_key(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=16, max_model_len=64)
    with pytest.raises(ValueError, match="API key is empty"):
        create_app(llm, "x", api_key="")


# -- 9: one request must not stall the others -------------------------------------------------------
def _stream_times(client, times: list, done: threading.Event, max_tokens: int):
    stream = client.completions.create(model=MODEL, prompt="keep going", max_tokens=max_tokens, stream=True,
                                       extra_body=NO_EOS)
    for _ in stream:
        times.append(time.monotonic())
    done.set()


def test_a_huge_prompt_is_refused_quickly_while_other_streams_go_on(server, client):
    times, done = [], threading.Event()
    reader = threading.Thread(target=_stream_times, args=(client, times, done, 400))
    reader.start()
    try:
        wait_until(lambda: len(times) >= 3, "the stream to start")
        start = time.monotonic()
        r = _post(server, "/v1/completions", _body(prompt="word " * (4 * 2 ** 20 // 5), max_tokens=1))
        end = time.monotonic()
        assert r.status_code == 400 and "maximum context length is 512" in r.json()["error"]["message"]
        assert end - start < 10  # tokenizing 4 MB with this tokenizer alone took ~20 s
        wait_until(lambda: any(t > end for t in times), "a chunk after the refusal", 120)
        window = [start] + [t for t in times if start < t < end] + [min(t for t in times if t > end)]
        gaps = [b - a for a, b in zip(window, window[1:])]
        assert max(gaps) < 2.0, f"the stream stalled {max(gaps):.1f} s while the huge prompt arrived"
    finally:
        reader.join(timeout=300)
    assert done.is_set()


def test_tokenizing_and_chat_templates_run_off_the_engine_thread(server, client, monkeypatch):
    tok = server.llm.tokenizer
    render, inside, release = tok.apply_chat_template, threading.Event(), threading.Event()

    def slow(messages, **kw):  # a template as slow as we like: until the test lets it go
        if "SLOW" in messages[0]["content"]:
            inside.set()
            release.wait(timeout=60)
        return render(messages, **kw)
    monkeypatch.setattr(tok, "apply_chat_template", slow, raising=False)
    times, done, results = [], threading.Event(), []
    reader = threading.Thread(target=_stream_times, args=(client, times, done, 300))
    reader.start()
    slow_one = threading.Thread(target=lambda: results.append(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "SLOW"}], max_tokens=2)))
    try:
        wait_until(lambda: len(times) >= 2, "the stream to start")
        slow_one.start()
        wait_until(inside.is_set, "the template to start")
        steps = metrics(server.base)["pacore_engine_steps_total"]
        # The engine keeps stepping (and the stream streaming) while the template is stuck.
        wait_until(lambda: metrics(server.base)["pacore_engine_steps_total"] >= steps + 5, "engine steps", 15)
        assert not results
    finally:
        release.set()
        slow_one.join(timeout=120)
        reader.join(timeout=300)
    assert results[0].choices[0].finish_reason in ("stop", "length") and done.is_set()


# -- 10: the queue counts sequences; slow, gone and half-closed readers --------------------------------
def test_the_queue_counts_sequences_not_requests(server, client, monkeypatch):
    monkeypatch.setattr(server.state, "max_queue", 4)
    with pytest.raises(openai.BadRequestError) as e:  # 2 prompts x n=3 can never be held
        client.completions.create(model=MODEL, prompt=["a", "b"], n=3, max_tokens=1)
    assert "6 sequences" in e.value.message and "--max-queue" in e.value.message
    gate, step = threading.Event(), server.llm.step
    monkeypatch.setattr(server.llm, "step", lambda: (gate.wait(), step())[1])  # hold the engine
    held = []
    thread = threading.Thread(target=lambda: held.append(client.completions.create(
        model=MODEL, prompt="held", n=3, max_tokens=2)))
    thread.start()
    try:
        wait_until(lambda: metrics(server.base)["pacore_queued_sequences"] == 3, "the first request")
        with pytest.raises(openai.RateLimitError) as e:  # 3 + 2 > 4
            client.completions.create(model=MODEL, prompt="two more", n=2, max_tokens=2)
        assert "--max-queue" in e.value.message
    finally:
        gate.set()
        thread.join()
    assert len(held[0].choices) == 3
    wait_until(lambda: metrics(server.base)["pacore_queued_sequences"] == 0, "the slots to be released")


def _stream_request(max_tokens: int, n: int = 1) -> bytes:
    body = json.dumps(_body(prompt="unread", max_tokens=max_tokens, n=n, stream=True, **NO_EOS)).encode()
    return body


def test_finished_streams_nobody_reads_hold_no_queue_slot_and_a_bounded_backlog(server, client, monkeypatch):
    monkeypatch.setattr(server.state, "max_queue", 2)
    jobs, submit = [], server.state.engine.submit
    monkeypatch.setattr(server.state.engine, "submit", lambda job: (jobs.append(job), submit(job))[1])
    socks = []
    for _ in range(2):  # two streams of ~12 KB chunks that nobody reads: the sockets' buffers fill
        body = _stream_request(480, n=1)
        socks.append(_raw(server, _head("/v1/completions", len(body)), body, rcvbuf=4096))
    try:
        wait_until(lambda: len(jobs) == 2 and metrics(server.base)["pacore_num_requests_in_engine"] == 0,
                   "the engine to finish both", 120)
        # The engine is done with them: their slots are free although their readers have read nothing.
        r = client.completions.create(model=MODEL, prompt="third", max_tokens=1)
        assert r.choices[0].finish_reason in ("stop", "length")
        for job in jobs:  # what waits for the reader: one wake-up and each choice's end, not a chunk per token
            assert job.events.qsize() <= job.params.n + 2
        for sock in socks:  # and the answer is whole once read
            reply = _read_all(sock)
            assert reply.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in reply
            assert reply.count(b'"finish_reason":"length"') == 1
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_half_closes_after_sending_gets_its_answer(server, stream):
    body = json.dumps(_body(prompt="half", max_tokens=8, stream=stream, **NO_EOS)).encode()
    sock = _raw(server, _head("/v1/completions", len(body)), body)
    sock.shutdown(socket.SHUT_WR)  # done sending; still reading
    reply = _read_all(sock)
    sock.close()
    while reply.startswith(b"HTTP/1.1 1"):  # interim responses (the server's probes), skipped as clients do
        reply = reply.partition(b"\r\n\r\n")[2]
    head, _, rest = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), reply[:200]
    assert (b"data: [DONE]" in rest) if stream else (b'"completion_tokens":8' in rest)


# -- 11: strict request types ------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("max_tokens", True), ("max_tokens", "2"), ("prompt", [True]),
                                         ("prompt", [[1, True]]), ("n", "2"), ("temperature", "1"),
                                         ("stream", "yes"), ("seed", 1.5), ("top_k", False)])
def test_wrong_types_are_422_naming_the_field(server, field, value):
    r = _post(server, "/v1/completions", _body(**{"prompt": "x", "max_tokens": 1, field: value}))
    assert r.status_code == 422 and r.json()["error"]["param"] == field, r.text


def test_seeds_outside_int64_and_uint64_are_refused(server):
    for seed in (2 ** 64, -2 ** 63 - 1, 10 ** 30):
        r = _post(server, "/v1/completions", _body(prompt="x", max_tokens=1, seed=seed))
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed" and "2**64" in r.text
    for seed in (2 ** 64 - 1, -2 ** 63, -1, 0):
        assert _post(server, "/v1/completions", _body(prompt="x", max_tokens=1, seed=seed)).status_code == 200


def test_a_body_that_is_not_declared_json_is_refused_clearly(server):
    body = _body(prompt="x", max_tokens=1)
    assert _post(server, "/v1/completions", body).status_code == 200
    for kind in (None, "text/plain", "application/x-www-form-urlencoded"):  # none too (issue 31: no web page)
        r = _post(server, "/v1/completions", body, content_type=kind)
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", '{"model": "%s", "prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", '{"model": "ti\\udfffny", "prompt": "x"}', "model"),
    ("/v1/completions", '{"model": "%s", "prompt": "x", "stop": ["\\ud800"]}', "stop"),
    ("/v1/completions", '{"model": "%s", "prompt": "x", "user": "\\ud800"}', "user"),
    ("/v1/completions", '{"model": "%s", "prompt": ["ok", "\\ud800"]}', "prompt"),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "\\ud800", "content": "x"}]}', "messages"),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "x", "name": "\\ud800"}]}',
     "messages"),
    ("/v1/chat/completions",
     '{"model": "%s", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}', "messages"),
])
def test_a_lone_surrogate_in_any_string_is_the_same_clear_400(server, path, body, param):
    r = _post(server, path, (body.replace("%s", MODEL)).encode())
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and "not valid Unicode" in error["message"], r.text


# -- 12: graceful shutdown -----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_stops_admitting_drains_for_a_bounded_time_then_aborts_and_exits(tiny_model_dir):
    port, base = _free_port(), None
    proc = subprocess.Popen([sys.executable, "-m", "pacore", "serve", "--model", str(tiny_model_dir("llama")),
                             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", "1024", "--num-kv-blocks", "128", "--shutdown-timeout", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            try:
                return httpx.get(f"{base}/health").status_code == 200
            except httpx.TransportError:
                return proc.poll() is not None  # died: say so below
        wait_until(up, "the server to start", 180)
        assert proc.poll() is None, proc.stderr.read().decode()
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        long_end, short = [], []

        def long_stream():  # 1000 steps: far beyond the 1 s drain
            body = {"model": "tiny", "prompt": "long", "max_tokens": 1000, "stream": True, **NO_EOS}
            try:
                with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as reply:
                    long_end.extend(line for line in reply.iter_lines() if line.startswith("data: "))
            except Exception as e:
                long_end.append(type(e).__name__)
        threads = [threading.Thread(target=long_stream), threading.Thread(target=lambda: short.append(
            client.completions.create(model="tiny", prompt="short", max_tokens=5, extra_body=NO_EOS)))]
        for t in threads:
            t.start()
        # both running, or the short one (5 tokens) already done on a busy machine: either way the
        # long stream is running when SIGTERM arrives
        wait_until(lambda: metrics(base)["pacore_num_requests_in_engine"] == 2
                   or (short and metrics(base)["pacore_num_requests_in_engine"] == 1), "both requests to run")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)

        def refused():
            try:
                httpx.get(f"{base}/health", timeout=2)
                return False
            except httpx.ConnectError:
                return True
        wait_until(refused, "new connections to be refused", 10)
        assert proc.wait(timeout=60) == 0
        exited = time.monotonic() - sent
        for t in threads:
            t.join(timeout=30)
        assert short[0].choices[0].finish_reason == "length" and short[0].usage.completion_tokens == 5
        # Cut at the drain's end as a stream ends: an error event, then [DONE]; and no traceback logged.
        assert long_end[-1] == "data: [DONE]" and "shutting down" in json.loads(long_end[-2][6:])["error"]["message"]
        assert 1 <= exited < 30  # the drain waited its 1 s for the long stream, then cut it
        log = proc.stderr.read().decode()
        assert "Traceback" not in log and "Cancel" not in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
