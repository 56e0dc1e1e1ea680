"""Serve the OpenAI-compatible app on 127.0.0.1 (a free port) in a thread, and read its /metrics."""
from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.serve.background import serve_in_background as serving  # noqa: F401


def wait_until(condition, what: str, limit_s: float = 60.0) -> None:
    """Poll until ``condition()`` holds; the limit only turns a hang into a failure."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def metrics(base_url: str) -> dict[str, float]:
    """/metrics as {sample name (with {label=value,...} when labelled): value}."""
    text = httpx.get(f"{base_url}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
