"""Prometheus metrics: the server's request and token counters, and the engine's own counters and
gauges read at scrape time from the stats the engine thread last published."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

# stats() key -> (metric name, help); the engine keeps these counters, the collector only reads them.
_ENGINE_COUNTERS = {
    "prefill_tokens": ("pacore_prefill_tokens", "Prompt tokens computed by prefill (prefix-cache hits excluded)"),
    "decode_tokens": ("pacore_decode_tokens", "Tokens computed by decode steps"),
    "prefix_cache_hit_tokens": ("pacore_prefix_cache_hit_tokens", "Prompt tokens taken from the prefix cache"),
    "cascade_decode_steps": ("pacore_cascade_decode_steps", "Decode steps that ran prefix-shared (cascade) attention"),
    "steps": ("pacore_engine_steps", "Engine steps run"),
    "preemptions": ("pacore_preemptions", "Sequences preempted for KV blocks (recomputed later)"),
}
_ENGINE_GAUGES = {
    "kv_blocks_used": ("pacore_kv_blocks_used", "KV blocks held by live sequences"),
    "kv_blocks_shared": ("pacore_kv_blocks_shared", "KV blocks held by more than one sequence"),
    "kv_blocks_total": ("pacore_kv_blocks_total", "KV blocks in the cache"),
    "kv_cache_tokens": ("pacore_kv_cache_tokens", "Tokens the KV cache holds"),
    "kv_bytes_per_token": ("pacore_kv_bytes_per_token", "KV cache bytes per token (all layers, K and V)"),
    "num_waiting": ("pacore_num_sequences_waiting", "Sequences queued for admission (the engine's queue length)"),
    "num_running": ("pacore_num_sequences_running", "Sequences running"),
    "num_requests": ("pacore_num_requests_in_engine", "HTTP requests with prompts in the engine"),
}

# With --speculative-config: vLLM's spec_decode_* counters under our prefix (engine/spec/speculator.py).
_SPEC_COUNTERS = {
    "spec_decode_num_drafts": ("pacore_spec_decode_num_drafts", "Verify steps of rows with draft tokens "
                               "(one row's drafts in one step)"),
    "spec_decode_num_draft_tokens": ("pacore_spec_decode_num_draft_tokens", "Draft tokens verified"),
    "spec_decode_num_accepted_tokens": ("pacore_spec_decode_num_accepted_tokens",
                                        "Draft tokens accepted (the target's own draw agreed), up to a stop"),
}


class _EngineCollector:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        stats = self.engine.latest_stats  # one dict, replaced whole by the engine thread
        for key, (name, doc) in _ENGINE_COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=stats[key])
        for key, (name, doc) in _ENGINE_GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=stats[key])
        yield InfoMetricFamily("pacore_kv_cache", "The KV cache's format", value={"dtype": stats["kv_cache_dtype"]})
        yield from _spec_metrics(stats)
        prefill, decode = self.engine.rates()
        yield GaugeMetricFamily("pacore_prefill_tokens_per_second", "Prefill tokens/s over the last 10 s", value=prefill)
        yield GaugeMetricFamily("pacore_decode_tokens_per_second", "Decode tokens/s over the last 10 s", value=decode)


def _spec_metrics(stats: dict):
    """Speculative decoding's counters, when the engine speculates (its stats have them)."""
    if "spec_decode_num_drafts" not in stats:
        return
    for key, (name, doc) in _SPEC_COUNTERS.items():
        yield CounterMetricFamily(name, doc, value=stats[key])
    per_pos = CounterMetricFamily("pacore_spec_decode_num_accepted_tokens_per_pos",
                                  "Draft tokens accepted at each draft position (0: the first)", labels=["position"])
    for pos, n in enumerate(stats["spec_decode_num_accepted_tokens_per_pos"]):
        per_pos.add_metric([str(pos)], n)
    yield per_pos


class ServerMetrics:
    """A registry of its own per server, so several servers (tests) never share counters."""

    def __init__(self, engine):
        self.registry = CollectorRegistry()
        self.requests = Counter("pacore_requests", "Generation requests by endpoint and outcome "
                                "(ok, error, aborted: the client went away)", ["endpoint", "outcome"],
                                registry=self.registry)
        self.prompt_tokens = Counter("pacore_prompt_tokens", "Prompt tokens of finished requests, each prompt once",
                                     registry=self.registry)
        self.completion_tokens = Counter("pacore_completion_tokens", "Tokens generated for finished requests, "
                                         "all choices", registry=self.registry)
        self.in_flight = Gauge("pacore_http_requests_in_flight", "Generation requests being served",
                               registry=self.registry)
        self.queued = Gauge("pacore_queued_sequences", "Sequences (prompts x n) of the requests in the engine, "
                            "bounded by --max-queue", registry=self.registry)
        self.registry.register(_EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)
