"""The routes that say what the server is: /v1/models and /v1/models/{id}, /health and /ping (vLLM's
SageMaker probe, GET or POST), /version, /metrics, and vLLM's /tokenizer_info, which lm-eval's
``tokenizer_backend=remote`` reads instead of downloading a tokenizer; and the error responses the
OpenAPI schema lists for the generation routes."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from .front_door import GUARDED_PREFIXES

# What /openapi.json says each generation and tokenizer route may answer besides 200 and 422.
_ERROR_SCHEMA = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": "string", "nullable": True},
    "code": {"type": "integer"}}}}}
_ERRORS = {400: "a value out of range, a prompt that does not fit, or a body that is not JSON",
           404: "a model this server does not serve",
           413: "a body larger than --max-body-bytes", 415: "a body not sent as Content-Type: application/json",
           429: "more sequences than --max-queue holds now", 503: "the engine is not running"}
ERROR_RESPONSES = {status: {"description": text, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
                   for status, text in _ERRORS.items()}
_NO_KEY = {"description": "no or a wrong API key (--api-key)", "content": {"application/json": {"schema": _ERROR_SCHEMA}}}


def list_key_errors(app: FastAPI) -> None:
    """Make /openapi.json list 401 on the routes the API key guards (front_door.py), and only there:
    called only when the server has a key."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            for path, operations in build()["paths"].items():  # build() caches what it returns
                if path.startswith(GUARDED_PREFIXES):
                    for operation in operations.values():
                        operation["responses"].setdefault("401", _NO_KEY)
        return app.openapi_schema
    app.openapi = openapi


def package_version() -> str:
    """This engine's version (the installed distribution's; "unknown" when run from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pacore-engine")
    except PackageNotFoundError:
        return "unknown"


def tokenizer_info(tokenizer) -> dict:
    """vLLM's /tokenizer_info: the tokenizer's configuration as tokenizer_config.json holds it (its
    class, special tokens as text, chat template), what a client needs to tokenize and render chats
    as the server does. ValueError without a tokenizer."""
    if tokenizer is None:
        raise ValueError("this server has no tokenizer (it was started without one)")
    info = {k: _plain(v) for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items()}
    info = {k: v for k, v in info.items() if v is not _UNSET}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):  # as text: lm-eval encodes them
        info[name] = getattr(tokenizer, name, None)
    info["chat_template"] = getattr(tokenizer, "chat_template", None)
    info["tokenizer_class"] = type(tokenizer).__name__
    return info


_UNSET = object()


def _plain(value):
    """A configuration value as JSON holds it (an AddedToken as its text); _UNSET when it has no JSON form."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "content"):  # tokenizers' AddedToken
        return value.content
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _UNSET if any(v is _UNSET for v in items) else items
    if isinstance(value, dict):
        items = {str(k): _plain(v) for k, v in value.items()}
        return _UNSET if any(v is _UNSET for v in items.values()) else items
    return _UNSET


def add_info_routes(app: FastAPI, server, api_error) -> None:
    """Register the routes above on ``app``; ``server`` is the app's _Server, ``api_error`` its APIError."""

    def card() -> dict:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "pacore",
                "root": server.model_name, "max_model_len": server.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}", responses={404: ERROR_RESPONSES[404]})
    async def model(model: str):
        server.check_model(model)
        return card()

    async def health():
        if not server.engine.alive:
            raise api_error(503, "the engine is not running")
        return {"status": "ok"}

    app.get("/health", responses={503: ERROR_RESPONSES[503]})(health)
    app.get("/ping", responses={503: ERROR_RESPONSES[503]}, operation_id="ping_get")(health)
    app.post("/ping", responses={503: ERROR_RESPONSES[503]}, operation_id="ping_post")(health)

    @app.get("/version")
    async def version():
        return {"version": package_version()}

    @app.get("/tokenizer_info", responses={400: ERROR_RESPONSES[400]})
    async def tokenizer_info_route():
        try:
            return tokenizer_info(server.prompts.tokenizer)
        except ValueError as e:
            raise api_error(400, str(e)) from None

    @app.get("/metrics", response_class=Response,
             responses={200: {"description": "Prometheus' text format", "content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics():
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)
