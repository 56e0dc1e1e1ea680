"""Serve an app from a background thread (tests, benchmarks, notebooks driving the server in-process)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serve_in_background(app, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 60.0) -> Iterator[str]:
    """Run ``app`` under uvicorn on a thread; yields its base URL (port 0: a free one) and stops it on exit."""
    import uvicorn

    from .connection import HalfCloseProtocol
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", http=HalfCloseProtocol))
    thread = threading.Thread(target=server.run, name="pacore-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:  # uvicorn offers no event to wait on
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join()
