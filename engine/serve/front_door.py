"""What a request meets before any route reads it (an ASGI middleware): the API key on the /v1
routes, a JSON content type, and the body's size. A route reads and parses the whole body before
it runs, so these refusals must come first: a 1 GB body without a key costs nothing here.

Every POST to a route that reads a body must say ``Content-Type: application/json``: a web page may send a POST with no type
(or a form's) to any origin without asking first, but a JSON one only after a CORS preflight,
which this server grants to the ``--allowed-origins`` alone (none by default). So a page cannot
start generations on a server without a key that listens on the browser's machine.

The key guards the /v1 routes and the tokenizer's (/tokenize, /detokenize, /tokenizer_info: a client that knows the
key sends it there too): /health, /ping, /version, /metrics, /docs and /openapi.json stay open (probes and scrapers
carry no key).
"""
from __future__ import annotations

import secrets

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from .protocol import error_body

GUARDED_PREFIXES = ("/v1", "/tokenize", "/detokenize", "/tokenizer_info")
# The routes that read a JSON body: a POST to one must say so. A POST elsewhere reads no body, and is
# left to the router (405 on a GET route, 404 on none).
JSON_ROUTES = ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize")


def check_api_key(api_key: str | None) -> str | None:
    """The key as clients send it: surrounding whitespace stripped (a key read from a file ends in a
    newline), as the server strips theirs; None for no key. ValueError for a key that is empty, which
    a careless reading would take for "no auth", or that no client can send in a header."""
    if api_key is None:
        return None
    key = api_key.strip()
    if not key:
        raise ValueError("the API key is empty (--api-key or $PACORE_API_KEY): give a key, or unset it to "
                         "serve without one")
    bad = next((i for i, c in enumerate(key) if not " " <= c <= "~"), None)
    if bad is not None:  # clients send header values as ASCII (httpx, the openai client, browsers)
        raise ValueError(f"the API key (--api-key or $PACORE_API_KEY) has a character at position {bad} that no "
                         "client can send in an HTTP header; use printable ASCII characters only (letters, "
                         "digits, punctuation)")
    return key


class FrontDoor:
    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        api_key = check_api_key(api_key)
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope, Headers(scope=scope))
        if refusal is not None:
            status, kind, message = refusal
            # Connection: close, so that the body left unread is never taken for a next request.
            reply = JSONResponse(error_body(message, kind, None, status), status_code=status,
                                 headers={"Connection": "close"})
            return await reply(scope, receive, send)
        return await self.app(scope, self._counted(receive), send)

    def _refusal(self, scope, headers: Headers) -> tuple[int, str, str] | None:
        if self.api_key is not None and scope["path"].startswith(GUARDED_PREFIXES):
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), self.api_key.encode()):
                return 401, "authentication_error", "invalid or missing API key: send 'Authorization: Bearer KEY'"
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return 413, "invalid_request_error", self._too_large()
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        if (scope["method"] == "POST" and scope["path"].rstrip("/") in JSON_ROUTES and media != "application/json"
                and not media.endswith("+json")):
            got = f"got {media!r}" if media else "it has none"
            return 415, "invalid_request_error", (f"the body must be JSON sent with 'Content-Type: application/json' "
                                                  f"({got})")
        return None

    def _too_large(self) -> str:
        return (f"the request body is larger than this server's limit of {self.max_body_bytes} bytes "
                "(--max-body-bytes)")

    def _counted(self, receive):
        """``receive`` that refuses a body (chunked, or longer than announced) once it passes the limit."""
        left = self.max_body_bytes

        async def counted():
            nonlocal left
            message = await receive()
            if message["type"] == "http.request":
                left -= len(message.get("body", b""))
                if left < 0:  # the route reading the body gets it, and answers 413
                    raise HTTPException(413, self._too_large(), headers={"Connection": "close"})
            return message
        return counted
