"""Prometheus metrics: the server's request and token counters, and the engine's own counters and
gauges read at scrape time from the stats the engine thread last published; and the same stats under
vLLM's names (``vllm:...``, labelled ``model_name``), so a dashboard built for vLLM reads them as they
are (docs/serving.md maps each name)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from .vllm_metrics import VllmRequestMetrics

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


# vLLM's name -> (help, the value from the engine's stats). Requests there are sequences here: vLLM
# counts each of a request's n choices as a request of its own.
_VLLM_GAUGES = {
    "vllm:num_requests_running": ("Sequences running (each of a request's n counts once)",
                                  lambda s: s["num_running"]),
    "vllm:num_requests_waiting": ("Sequences waiting to be admitted", lambda s: s["num_waiting"]),
    "vllm:kv_cache_usage_perc": ("KV cache usage: blocks held / blocks in the cache (1 = full)", lambda s: _usage(s)),
    "vllm:gpu_cache_usage_perc": ("KV cache usage (vLLM's older name of kv_cache_usage_perc)", lambda s: _usage(s)),
}
_VLLM_COUNTERS = {
    "vllm:prompt_tokens": ("Prompt tokens processed: computed by prefill or taken from the prefix cache",
                           lambda s: s["prefill_tokens"] + s["prefix_cache_hit_tokens"]),
    "vllm:generation_tokens": ("Tokens generated, each sequence's first (sampled from its prefill) too",
                               lambda s: s["generated_tokens"]),
    "vllm:num_preemptions": ("Sequences preempted for KV blocks", lambda s: s["preemptions"]),
    "vllm:prefix_cache_queries": ("Prompt tokens looked up in the prefix cache",
                                  lambda s: s["prefill_tokens"] + s["prefix_cache_hit_tokens"]),
    "vllm:prefix_cache_hits": ("Prompt tokens found in the prefix cache", lambda s: s["prefix_cache_hit_tokens"]),
}


def _usage(stats: dict) -> float:
    return stats["kv_blocks_used"] / stats["kv_blocks_total"] if stats["kv_blocks_total"] else 0.0


class _VllmCollector:
    """The engine's stats under vLLM's metric names, with its ``model_name`` label."""

    def __init__(self, engine, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self):
        stats, label = self.engine.latest_stats, [self.model_name]
        for name, (doc, value) in _VLLM_GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(label, value(stats))
            yield family
        for name, (doc, value) in _VLLM_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(label, value(stats))
            yield family
        if "spec_decode_num_drafts" not in stats:
            return
        for key, (ours, doc) in _SPEC_COUNTERS.items():
            family = CounterMetricFamily(ours.replace("pacore_", "vllm:"), doc, labels=["model_name"])
            family.add_metric(label, stats[key])
            yield family
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at "
                                      "each draft position (0: the first)", labels=["model_name", "position"])
        for pos, n in enumerate(stats["spec_decode_num_accepted_tokens_per_pos"]):
            per_pos.add_metric([self.model_name, str(pos)], n)
        yield per_pos


def cache_config(llm) -> dict:
    """vLLM's cache_config_info labels, as this engine's KV cache has them."""
    o = llm.options
    return {"block_size": llm.block_size, "cache_dtype": o.kv_cache_dtype, "enable_prefix_caching": o.enable_prefix_caching,
            "gpu_memory_utilization": o.gpu_memory_utilization, "num_gpu_blocks": llm.block_manager.num_blocks}


class ServerMetrics:
    """A registry of its own per server, so several servers (tests) never share counters."""

    def __init__(self, engine, model_name: str = "default", max_model_len: int = 2048, cache: dict | None = None):
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
        self.registry.register(_VllmCollector(engine, model_name))
        # vLLM's request and step histograms, observed on the engine thread (vllm_metrics.py)
        engine.request_metrics = VllmRequestMetrics(self.registry, model_name, max_model_len, cache or {})

    def render(self) -> bytes:
        return generate_latest(self.registry)
