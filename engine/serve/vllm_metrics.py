"""vLLM's per-request and per-step metrics, under its names and buckets (prometheus-client histograms
and counters observed as requests finish and steps end), so vLLM's sample Grafana dashboard reads
pacore serve as it reads vLLM (docs/serving.md maps each name).

What one observation is: a request here is an engine request (one prompt; its n choices share the
prefill), so the latency histograms (time to first token, end to end, queue, prefill, decode, time per
output token) and request_prompt_tokens / request_params_* are observed once per prompt; a choice
is vLLM's finished request for request_success_total (by finished_reason) and
request_generation_tokens. inter_token_latency_seconds is observed per prompt and step that added
tokens to it; iteration_tokens_total per engine step (prompt tokens computed + tokens generated).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, Info

# vLLM's buckets (vllm/v1/metrics/loggers.py)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
         80.0, 160.0, 640.0, 2560.0)
_PER_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
              80.0)
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0)
_N = (1, 2, 5, 10, 20)


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's build_1_2_5_buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class VllmRequestMetrics:
    """The histograms and counters; ``finished`` and ``step`` are called on the engine thread."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int, cache: dict):
        label = ["model_name"]

        def hist(name, doc, buckets):
            return Histogram(name, doc, label, buckets=buckets, registry=registry).labels(model_name)
        tokens = buckets_1_2_5(max_model_len)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token: arrival to the step that "
                         "sampled it", _TTFT)
        self.itl = hist("vllm:inter_token_latency_seconds", "Time between a request's steps that added tokens",
                        _PER_TOKEN)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Decode time over the tokens after the first "
                         "(the request's longest choice)", _PER_TOKEN)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to the end of its last choice", _REQUEST)
        self.queue = hist("vllm:request_queue_time_seconds", "Arrival to its first scheduled step", _REQUEST)
        self.prefill = hist("vllm:request_prefill_time_seconds", "First scheduled step to its first token", _REQUEST)
        self.decode = hist("vllm:request_decode_time_seconds", "First token to the end of its last choice", _REQUEST)
        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Prompt tokens per request", tokens)
        self.generation_tokens = hist("vllm:request_generation_tokens", "Tokens generated per choice", tokens)
        self.max_generation = hist("vllm:request_max_num_generation_tokens", "Tokens of a request's longest choice",
                                   tokens)
        self.params_n = hist("vllm:request_params_n", "The n of each request", _N)
        self.params_max_tokens = hist("vllm:request_params_max_tokens", "The max_tokens of each request (the "
                                      "context left when not given)", tokens)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Tokens per engine step: prompt tokens computed "
                                     "and tokens generated", buckets_1_2_5(max(max_model_len, 8192)))
        self.success = Counter("vllm:request_success", "Finished choices by finish reason", label + ["finished_reason"],
                               registry=registry)
        self.model_name = model_name
        Info("vllm:cache_config", "The KV cache's configuration", registry=registry).info(
            {k: str(v) for k, v in cache.items()})
        self._marks: dict[str, tuple[float, int]] = {}  # engine request id -> (time, tokens) at its last step

    def step(self, tokens: int, progress: dict[str, int], now: float) -> None:
        """One engine step: ``tokens`` it computed or generated; ``progress``: tokens generated so far by
        each running engine request (the requests that gained some get an inter-token latency)."""
        if tokens:
            self.iteration_tokens.observe(tokens)
        for rid, count in progress.items():
            self._advance(rid, count, now)

    def _advance(self, rid: str, count: int, now: float) -> None:
        last = self._marks.get(rid)
        if last is None or count > last[1]:
            if last is not None and last[1] > 0:
                self.itl.observe(now - last[0])
            self._marks[rid] = (now, count)

    def finished(self, out, n: int, max_tokens: int) -> None:
        """An engine request's RequestOutput (its metrics in the engine's clock), its n and max_tokens."""
        m, counts = out.metrics, [len(o.token_ids) for o in out.outputs]
        self._advance(out.request_id, sum(counts), m.finished_time)
        self._marks.pop(out.request_id, None)
        self.params_n.observe(n)
        self.params_max_tokens.observe(max_tokens)
        self.prompt_tokens.observe(len(out.prompt_token_ids))
        self.e2e.observe(m.finished_time - m.arrival_time)
        if m.scheduled_time is not None:
            self.queue.observe(m.scheduled_time - m.arrival_time)
        if m.first_token_time is not None:
            self.ttft.observe(m.first_token_time - m.arrival_time)
            if m.scheduled_time is not None:
                self.prefill.observe(m.first_token_time - m.scheduled_time)
            self.decode.observe(m.finished_time - m.first_token_time)
            if max(counts) > 1:
                self.tpot.observe((m.finished_time - m.first_token_time) / (max(counts) - 1))
        self.max_generation.observe(max(counts))
        for o, n in zip(out.outputs, counts):
            self.generation_tokens.observe(n)
            self.success.labels(self.model_name, o.finish_reason).inc()

    def forget(self, rid: str) -> None:
        """An engine request that was aborted (its client went away, or its step failed)."""
        self._marks.pop(rid, None)
