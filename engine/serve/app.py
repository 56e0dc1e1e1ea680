"""The routes: /v1/chat/completions, /v1/completions, /v1/models, /tokenize and /detokenize
(tokenize.py), /health, /metrics (the API key,
the body limit and the content type are checked before them: front_door.py; CORS, when origins are
allowed, before that). Past 300 lines: the two completion routes share their helpers here (submit,
collect, stream); their JSON is rendered off the event loop (replies.py)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from engine.sample.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS

from . import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_LOGPROB_ENTRIES
from . import protocol as api
from .engine_loop import ChoiceEnd, EngineLoop, EngineUnavailable, Failed, Job, JobDone, TextReady
from .front_door import FrontDoor, check_api_key
from .info import ERROR_RESPONSES, add_info_routes, list_key_errors
from .logprobs import TokenTexts
from .metrics import ServerMetrics, cache_config
from .prompts import PromptReader
from .replies import Renderer, logprob_entries
from .tokenize import TOKENIZE_TAGS, DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from .vllm_only import missing_feature

log = logging.getLogger("pacore.serve")
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's and vLLM's for /v1/completions; chat fills the context


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        # A lone surrogate the client sent (e.g. in `model`) cannot be encoded as UTF-8: escape it.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        # code = the HTTP status, as vLLM sends it: clients reading an error inside a stream (the
        # reference PaCoRe client) take it for the status.
        return api.error_body(self.message, _ERROR_TYPES[self.status], self.param, self.status)


class _ClientGone(Exception):
    pass


class _Server:
    """What the routes share: the engine thread, the metrics and the limits."""

    def __init__(self, llm, model_name: str, max_queue: int, limits: api.Limits, max_logprob_entries: int,
                 aliases: tuple[str, ...] = ()):
        self.engine = EngineLoop(llm)
        self.metrics = ServerMetrics(self.engine, model_name, llm.max_model_len, cache_config(llm))
        self.model_name, self.max_queue = model_name, max_queue
        self.answers_to = {model_name, *aliases}  # the names a request's "model" may hold
        self.max_model_len = llm.max_model_len
        self.limits, self.max_logprob_entries = limits, max_logprob_entries
        self.texts = TokenTexts(llm.tokenizer)  # each token decoded once, for every reply
        self.prompts = PromptReader(llm.tokenizer, llm.max_model_len)
        self.created = int(time.time())
        self.sampling_defaults: dict = {}  # --generation-config's
        self.prompt_tokens_details = False  # --enable-prompt-tokens-details: usage counts the cached prompt tokens
        self.in_flight = 0  # generation requests being served; only the event loop touches it
        self.queued = 0  # sequences (prompts x n) the engine holds or will: what --max-queue bounds

    async def generate(self, request: Request, body: api._Generate, endpoint: str, prompts: list):
        try:
            job = await self._submit(body, endpoint, prompts)
        except APIError:
            self.metrics.requests.labels(endpoint, "error").inc()
            raise
        self.in_flight += 1
        self.metrics.in_flight.inc()
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        rid = f"{prefix}-{body.request_id}" if body.request_id is not None else api.new_id(prefix)  # vLLM's
        renderer = Renderer(self.model_name, self.texts, endpoint == "chat", job.params, rid, int(time.time()),
                            prompt_logprobs=body.prompt_logprobs is not None and not body.stream)
        if body.stream:
            chunks = self._stream(job, body, endpoint, renderer)
            await anext(chunks)  # until the engine accepts: a refused request is an HTTP error, not a stream
            return StreamingResponse(chunks, media_type="text/event-stream")
        outcome = "aborted"
        try:
            reply = await _unless_disconnected(request, self._collect(job, renderer))
            outcome = "ok"
            return reply
        except APIError:
            outcome = "error"
            raise
        except _ClientGone:
            return Response(status_code=499)  # nobody reads it: the connection is closed
        finally:
            self._close(job, endpoint, outcome)

    def check_model(self, model: str | None) -> None:
        if model not in self.answers_to:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.model_name}`.", param="model")

    async def tokenizer_call(self, work, *args) -> dict:
        """``work(tokenizer, *args)`` on a worker thread (a long text takes seconds); ValueError: 400."""
        if args[0].model is not None:
            self.check_model(args[0].model)
        try:
            return await asyncio.to_thread(work, self.prompts.tokenizer, *args)
        except ValueError as e:
            raise APIError(400, str(e)) from None

    async def _submit(self, body: api._Generate, endpoint: str, prompts: list) -> Job:
        self.check_model(body.model)
        if not prompts:
            raise APIError(400, "prompt is empty", param="prompt")
        chat = endpoint == "chat"
        if body.ignored_fields():  # vLLM's words
            log.warning("The following fields were present in the request but ignored: %s", body.ignored_fields())
        try:
            params = body.sampling_params(None if chat else DEFAULT_COMPLETION_MAX_TOKENS, self.limits,
                                          self.sampling_defaults)
        except ValueError as e:
            field = str(e).partition(" ")[0].removeprefix("SamplingParams.")
            raise APIError(400, str(e), param=field if field in type(body).model_fields else None) from None
        release = self._hold(len(prompts) * params.n, len(prompts), params.n)
        try:
            # A worker thread: a long prompt must not hold up the event loop or the engine thread.
            template = body.template() if chat else None
            ids = await asyncio.to_thread(lambda: [self.prompts.token_ids(
                p, chat, params, template, body.add_special_tokens, body.truncate_prompt_tokens) for p in prompts])
            self._check_reply_size(body, params, [len(i) for i in ids], chat)
            cut = body.truncate_prompt_tokens is not None  # an echo shows what was kept
            echo = [self.prompts.text(i if cut else p, i) for p, i in zip(prompts, ids)] if body.echoes() else None
            job = Job(ids, params, body.stream, asyncio.get_running_loop(), on_done=release, echo=echo,
                      echo_only=body.echo_only(), cache_salt=body.cache_salt)
            self.engine.submit(job)
        except BaseException as e:
            release()
            if isinstance(e, ValueError):
                raise APIError(400, str(e)) from None
            if isinstance(e, EngineUnavailable):
                raise APIError(503, str(e)) from None
            raise
        return job

    def _check_reply_size(self, body: api._Generate, params, prompt_lens: list[int], chat: bool) -> None:
        """Refuse a request whose replies could hold more logprob entries than --max-logprob-entries."""
        copies = 0 if body.prompt_logprobs is None or body.stream else 1 if chat else params.n
        entries = logprob_entries(prompt_lens, params, self.max_model_len, body.echoes(), copies)
        if entries > self.max_logprob_entries:
            field = body.logprobs_field() if params.logprobs is not None else "prompt_logprobs"
            raise APIError(400, f"this request could return up to {entries} log-probabilities (per token with "
                                "logprobs, the chosen one and the top ones asked for, over every choice and the "
                                "echoed or asked-for prompt), more than this server's limit of "
                                f"{self.max_logprob_entries} per request (--max-logprob-entries); lower n, "
                                f"max_tokens or {field}", param=field)

    def _hold(self, seqs: int, num_prompts: int, n: int):
        """Count ``seqs`` against --max-queue until the returned release() (idempotent) is called:
        when the engine is done with them, not when the client has read them."""
        if seqs > self.max_queue:
            raise APIError(400, f"this request asks for {seqs} sequences ({num_prompts} prompts x n={n}), more "
                                f"than the server holds at once (--max-queue {self.max_queue}); lower n or send "
                                "fewer prompts", param="n")
        if self.queued + seqs > self.max_queue:
            raise APIError(429, f"the server holds {self.queued} of its {self.max_queue} sequences (--max-queue: "
                                f"prompts x n of the requests in the engine); this one needs {seqs}; retry later")
        self.queued += seqs
        self.metrics.queued.set(self.queued)
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.queued -= seqs
                self.metrics.queued.set(self.queued)
        return release

    def _close(self, job: Job, endpoint: str, outcome: str) -> None:
        job.on_done()  # already done unless the request was aborted
        self.in_flight -= 1
        self.metrics.in_flight.dec()
        self.metrics.requests.labels(endpoint, outcome).inc()
        if outcome == "aborted":  # the client went away: free its blocks
            try:
                self.engine.abort(job)
            except EngineUnavailable:
                pass

    async def _collect(self, job: Job, renderer: Renderer) -> Response:
        ends: dict[int, ChoiceEnd] = {}
        while True:
            event = await job.events.get()
            if isinstance(event, Failed):
                raise APIError(event.status, event.message, event.param)
            if isinstance(event, ChoiceEnd):
                ends[event.index] = event
            elif isinstance(event, JobDone):
                break
        usage = self._count(event, ends.values())
        # A worker thread: the reply may be megabytes of logprobs (replies.py).
        body = await asyncio.to_thread(renderer.reply, [e for _, e in sorted(ends.items())], usage)
        return Response(body, media_type="application/json")

    def _count(self, done: JobDone, ends) -> api.Usage:
        completion = sum(e.num_tokens for e in ends)
        self.metrics.prompt_tokens.inc(done.prompt_tokens)
        self.metrics.completion_tokens.inc(completion)
        return api.usage(done.prompt_tokens, completion, done.cached_tokens if self.prompt_tokens_details else None)

    async def _stream(self, job: Job, body: api._Generate, endpoint: str, renderer: Renderer):
        """Server-sent events: one chunk stream per choice index, usage if asked, then [DONE]. A
        chunk with logprobs is rendered on a worker thread (an echo's holds the whole prompt's)."""
        outcome, chat = "aborted", endpoint == "chat"

        async def chunk(index: int, text: str | None, finish: str | None = None, role: bool = False,
                        pieces=None, tokens: int = 0, stop_reason=None) -> str:
            # continuous_usage_stats (vLLM's): each chunk says its choice's prompt and tokens so far
            use = api.usage(len(job.prompts[index // job.params.n]), tokens) if body.continuous_usage else None
            if pieces:
                return await asyncio.to_thread(renderer.chunk, index, text, finish, role, pieces, use, stop_reason)
            return renderer.chunk(index, text, finish, role, pieces, use, stop_reason)
        try:
            event = await job.events.get()
            if isinstance(event, Failed):
                raise APIError(event.status, event.message, event.param)
            yield ""  # accepted: generate() returns the stream from here
            if chat:
                for index in range(len(job.prompts) * job.params.n):
                    yield await chunk(index, "", role=True)
            ends = []
            while True:
                event = await job.events.get()
                if isinstance(event, TextReady):
                    for index, (text, pieces) in job.take_text().items():
                        yield await chunk(index, text, pieces=pieces if job.logprobs else None,
                                          tokens=job.texts[index].seen)
                elif isinstance(event, ChoiceEnd):
                    ends.append(event)
                    yield await chunk(event.index, event.text, event.finish_reason, pieces=event.logprobs,
                                      tokens=event.num_tokens, stop_reason=event.stop_reason)
                elif isinstance(event, Failed):  # after the 200: report it inside the stream, as vLLM
                    outcome = "error"
                    yield f"data: {json.dumps(APIError(event.status, event.message).body())}\n\n"
                    break
                elif isinstance(event, JobDone):
                    usage = self._count(event, ends)
                    if body.include_usage:
                        yield renderer.usage_chunk(usage)
                    outcome = "ok"
                    break
            yield "data: [DONE]\n\n"
        except APIError:
            outcome = "error"
            raise
        finally:  # also when the client disconnects: the stream is cancelled here
            self._close(job, endpoint, outcome)


def _sentence(err: dict) -> str:
    """A validation error as a plain sentence saying what to do: pydantic's own words, without the
    "Value error, " it puts before a validator's message."""
    if err["type"] in ("value_error", "assertion_error"):
        return str(err["ctx"]["error"])
    if err["type"] == "extra_forbidden":
        return missing_feature(str(err["loc"][-1])) or "not a field of this endpoint; remove it"
    if err["type"] == "missing":
        return "this field is required; add it"
    return err["msg"]


async def _unless_disconnected(request: Request, work):
    """Await ``work`` unless the client disconnects first (then cancel it and raise _ClientGone)."""
    async def gone():
        while (await request.receive())["type"] != "http.disconnect":
            pass
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise _ClientGone()
    return task.result()


def create_app(llm, model_name: str, api_key: str | None = None, max_queue: int = 1024,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, aliases: tuple[str, ...] = (),
               max_logprob_entries: int = DEFAULT_MAX_LOGPROB_ENTRIES, max_stop_strings: int = MAX_STOP_STRINGS,
               max_stop_chars: int = MAX_STOP_CHARS, allowed_origins: list[str] | None = None,
               sampling_defaults: dict | None = None, prompt_tokens_details: bool = False) -> FastAPI:
    """An OpenAI-compatible app serving ``llm`` as ``model_name``; the engine thread runs while the
    app does (its lifespan). ``api_key``: /v1 routes need ``Authorization: Bearer KEY`` (surrounding
    whitespace stripped; an empty key, or one no client can send in a header, is refused).
    ``max_queue``: sequences held at once; more get 429. ``max_body_bytes``: a longer request body
    gets 413, unread. ``aliases``: other names a request's ``model`` may hold (replies and /v1/models
    carry ``model_name``). ``max_logprob_entries``: the most log-probabilities one request's replies
    may hold (replies.py), ``max_stop_strings`` / ``max_stop_chars``: its stop strings; beyond, 400.
    ``allowed_origins``: the web origins browsers may call the API from (CORS; default none).
    ``sampling_defaults``: what a request that leaves temperature, top_p, top_k, min_p or
    repetition_penalty out gets instead of OpenAI's defaults (--generation-config).
    ``prompt_tokens_details``: usage says the prompt tokens the prefix cache held (vLLM's flag)."""
    api_key = check_api_key(api_key)
    limits = api.Limits(llm.options.max_logprobs, max_stop_strings, max_stop_chars)
    server = _Server(llm, model_name, max_queue, limits, max_logprob_entries, aliases)
    server.sampling_defaults = dict(sampling_defaults or {})
    server.prompt_tokens_details = prompt_tokens_details

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.engine.start()
        yield
        await asyncio.to_thread(server.engine.close)

    app = FastAPI(title="PaCoRe Engine (OpenAI-compatible)", lifespan=lifespan)
    app.state.server = server
    app.add_middleware(FrontDoor, api_key=api_key, max_body_bytes=max_body_bytes)
    if allowed_origins:  # outermost: a browser's preflight carries no key and is answered here
        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"], allow_headers=["*"])

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):  # e.g. an unknown route, a body not UTF-8
        kind = _ERROR_TYPES.get(e.status_code, "server_error" if e.status_code >= 500 else "invalid_request_error")
        return JSONResponse(api.error_body(str(e.detail), kind, None, e.status_code), status_code=e.status_code,
                            headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        errors = e.errors()
        if any(err["type"] == "json_invalid" for err in errors):  # not JSON at all: a bad request
            detail = errors[0].get("ctx", {}).get("error", "")
            return JSONResponse(APIError(400, f"malformed JSON body: {detail}").body(), status_code=400)
        # A bad text is a 400, as the engine's refusal of a bad prompt; a wrong type or field is a 422.
        errors = [err for err in errors if err["type"] == api.INVALID_UNICODE] or errors
        status = 400 if errors[0]["type"] == api.INVALID_UNICODE else 422
        locs = [[str(x) for i, x in enumerate(err["loc"]) if x != "body" and not (i == 1 and x in TOKENIZE_TAGS)]
                for err in errors]
        message = "; ".join(f"{'.'.join(loc) or 'body'}: {_sentence(err)}" for loc, err in zip(locs, errors))
        # param: the request's field (a union's error locations also name the member types tried).
        return JSONResponse(APIError(status, message, locs[0][0] if locs[0] else None).body(), status_code=status)

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: api.ChatCompletionRequest, request: Request):
        messages = [m.for_template() for m in body.messages]
        return await server.generate(request, body, "chat", [messages])

    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(body: api.CompletionRequest, request: Request):
        return await server.generate(request, body, "completions", body.prompts())

    @app.post("/tokenize", responses=ERROR_RESPONSES)
    async def tokenize_route(body: TokenizeRequest):
        return await server.tokenizer_call(tokenize, body, server.max_model_len)

    @app.post("/detokenize", responses=ERROR_RESPONSES)
    async def detokenize_route(body: DetokenizeRequest):
        return await server.tokenizer_call(detokenize, body)

    add_info_routes(app, server, APIError)
    if api_key is not None:
        list_key_errors(app)
    return app
