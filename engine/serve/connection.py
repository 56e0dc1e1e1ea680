"""uvicorn's server with a drain that ends what it cuts as the API ends a failed request, and its
HTTP/1.1 protocol (h11), except that a client that half-closes after sending its request
(``shutdown(SHUT_WR)``, as `curl` and scripts do) still gets the answer: uvicorn takes the end of
its input for a disconnect and drops the request.

TCP cannot tell a half-close from a close until the server writes, so while the answer is not
started the connection is probed with an interim ``100 Continue`` (every HTTP/1.1 client skips 1xx
responses): a client that has really gone answers the first probe with a reset, a later probe's
write fails, and that is the disconnect that aborts its request and frees its blocks.
"""
from __future__ import annotations

import asyncio

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

# A gone client is noticed within two probes: short, so an abandoned request does not keep
# decoding (and holding KV) for long; a probe is a few bytes.
PROBE_INTERVAL_S = 0.2


class HalfCloseProtocol(H11Protocol):
    def eof_received(self) -> bool:
        cycle = self.cycle
        if cycle is None or cycle.response_complete or self.conn.their_state is not h11.DONE:
            return False  # no whole request to answer: close, as uvicorn does
        cycle.keep_alive = False  # nothing more can come: close after this answer
        self._probe()
        return True  # keep the transport open for the answer

    def _probe(self) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_started or cycle.disconnected or self.transport.is_closing():
            return
        self.transport.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")))
        self.loop.call_later(PROBE_INTERVAL_S, self._probe)


def serve(app, drain_s: float, host: str, port: int, **config) -> None:
    """Run ``app`` (create_app's) under uvicorn until SIGTERM or Ctrl-C, then drain it for ``drain_s``
    seconds; ``config``: more of uvicorn.Config's options (log_level, access_log)."""
    config = uvicorn.Config(app, host=host, port=port, http=HalfCloseProtocol, **config,
                            timeout_graceful_shutdown=drain_s + 10)  # a backstop: the drain ends first
    DrainingServer(config, drain_s, app.state.server.engine.close).run()


class DrainingServer(uvicorn.Server):
    """On SIGTERM, uvicorn stops admitting and waits for the requests it has; at ``drain_s`` this
    fails what still runs through the engine (``stop(reason)``, e.g. EngineLoop.close): a stream then
    ends with an error event and ``data: [DONE]``, a plain request with a 503. uvicorn's own timeout,
    a little later, would cancel them instead: a stream cut mid-chunk, and a traceback in the log."""

    def __init__(self, config: uvicorn.Config, drain_s: float, stop):
        super().__init__(config)
        self.drain_s, self.stop = drain_s, stop

    async def shutdown(self, sockets=None) -> None:
        reason = (f"the server is shutting down: this request ran past its drain (--shutdown-timeout "
                  f"{self.drain_s:g} s) and was cut; send it again to a running server")
        stopping = []  # the task, referenced while it runs

        def cut() -> None:
            stopping.append(asyncio.ensure_future(asyncio.to_thread(self.stop, reason)))
        timer = asyncio.get_running_loop().call_later(self.drain_s, cut)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
