"""Where an engine step's time goes: the host's parts against the device's forward, per kind of step
(a plain decode, a speculative verify step, a self-drafting draft step), for bench/gpu/e2e.py.

With ``record_steps=True`` the engine's StepRecord gives each step's schedule_s, model_s and sample_s,
and on CUDA model_s waits for the device, so it mixes the host's preparation of the step's tensors with
the GPU's forward. StepTimer (a StepObserver, attached while measuring) splits it:

- prepare: ModelRunner.prepare / prepare_draft, timed on the host (they build host tensors only);
- forward: each ModelRunner.execute timed on the device by CUDA events around it (the copies in, the
  forward, the LM head), and each CUDA-graph replay alone (the graph's GPU time, no host launch in it).

A step's host share is 1 - forward / (schedule + model + sample). The sampler's few kernels count on
the host's side of it, so the share is an upper bound. On a CPU there are no events: the device
figures are None and only the host's parts are measured.
"""
from __future__ import annotations

import statistics
import time

from engine.core.observers import StepObserver


def execute_kind(inputs) -> str:
    """"draft", "verify" (several queries per decode row), "decode", "prefill" or "mixed"."""
    meta = inputs.meta
    if inputs.draft:
        return "draft"
    if meta.num_prefill_tokens:
        return "mixed" if meta.decode_seq_lens is not None and len(meta.decode_seq_lens) else "prefill"
    return "verify" if meta.decode_cu_seqlens_q is not None else "decode"


class _TimedGraph:
    """A captured graph whose replays are bracketed by CUDA events."""

    def __init__(self, graph, timer: "StepTimer"):
        self.graph, self.timer = graph, timer

    def replay(self) -> None:
        start, end = self.timer.event(), self.timer.event()
        start.record()
        self.graph.replay()
        end.record()
        self.timer.current.setdefault("replays", []).append((start, end))


class StepTimer(StepObserver):
    """Use as ``with StepTimer(llm) as timer: llm.generate(...)``; then ``timer.summary()``."""

    def __init__(self, llm):
        self.llm, self.runner = llm, llm.runner
        self.cuda = self.runner.device.type == "cuda"
        self.steps: list[dict] = []
        self.current: dict = {}

    def event(self):
        import torch
        return torch.cuda.Event(enable_timing=True)

    def __enter__(self) -> "StepTimer":
        r = self.runner
        for name in ("prepare", "prepare_draft"):
            setattr(r, name, self._timed_prepare(getattr(r, name)))
        r.execute = self._timed_execute(r.execute)
        if r.graphs is not None and not r.graphs.emulate:
            r.graphs.graphs = {k: (_TimedGraph(g, self), out) for k, (g, out) in r.graphs.graphs.items()}
        self.llm.add_observer(self)
        return self

    def __exit__(self, *exc) -> None:
        r = self.runner
        for name in ("prepare", "prepare_draft", "execute"):  # the instance's wrappers shadow the methods
            r.__dict__.pop(name, None)
        if r.graphs is not None and not r.graphs.emulate:
            r.graphs.graphs = {k: (g.graph if isinstance(g, _TimedGraph) else g, out)
                               for k, (g, out) in r.graphs.graphs.items()}
        self.llm.remove_observer(self)

    def _timed_prepare(self, fn):
        def prepare(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            self.current["prepare_s"] = self.current.get("prepare_s", 0.0) + time.perf_counter() - t
            return out
        return prepare

    def _timed_execute(self, fn):
        def execute(inputs):
            lens = inputs.meta.decode_seq_lens
            call = dict(kind=execute_kind(inputs), rows=len(inputs.sample_idx) if lens is None else len(lens),
                        tokens=len(inputs.ids), graph=bool(inputs.graph))
            if self.cuda:
                call["events"] = (self.event(), self.event())
                call["events"][0].record()
            out = fn(inputs)
            if self.cuda:
                call["events"][1].record()
            self.current.setdefault("calls", []).append(call)
            return out
        return execute

    def step_started(self) -> None:
        self.current = {}

    def step_finished(self, record) -> None:
        self.current["record"] = record
        self.steps.append(self.current)

    def summary(self) -> dict:
        """Per kind of step ("decode": plain decode steps; "spec": steps with a verify or draft forward):
        mean milliseconds of each part and the host share; per kind of forward ("decode", "verify",
        "draft"): its mean device milliseconds, rows and tokens (the figures a device model prices)."""
        if self.cuda:
            import torch
            torch.cuda.synchronize()
        by_step: dict[str, list[dict]] = {}
        by_call: dict[str, list[dict]] = {}
        for s in self.steps:
            rec, calls = s["record"], s.get("calls", [])
            kinds = {c["kind"] for c in calls}
            if rec.kind != "decode" or not calls or kinds - {"decode", "verify", "draft"}:
                continue
            gpu = sum(_ms(*c["events"]) for c in calls) if self.cuda else None
            replay = sum(_ms(*e) for e in s.get("replays", [])) if self.cuda else None
            wall = 1e3 * (rec.schedule_s + rec.model_s + rec.sample_s)
            by_step.setdefault("decode" if kinds == {"decode"} else "spec", []).append(dict(
                wall_ms=wall, schedule_ms=1e3 * rec.schedule_s, prepare_ms=1e3 * s.get("prepare_s", 0.0),
                model_ms=1e3 * rec.model_s, sample_ms=1e3 * rec.sample_s, gpu_ms=gpu, replay_ms=replay,
                rows=rec.num_decode_seqs))
            for c in calls:
                by_call.setdefault(c["kind"], []).append(dict(gpu_ms=_ms(*c["events"]) if self.cuda else None,
                                                              rows=c["rows"], tokens=c["tokens"], graph=c["graph"]))
        steps = {}
        for kind, rows in by_step.items():
            mean = {k: _mean([r[k] for r in rows]) for k in rows[0]}
            mean["host_share"] = None if mean["gpu_ms"] is None else max(0.0, 1 - mean["gpu_ms"] / mean["wall_ms"])
            steps[kind] = dict(steps=len(rows), **mean)
        forwards = {kind: dict(calls=len(rows), graphs=sum(r["graph"] for r in rows),
                               **{k: _mean([r[k] for r in rows]) for k in ("gpu_ms", "rows", "tokens")})
                    for kind, rows in by_call.items()}
        return dict(steps=steps, forwards=forwards)


def _ms(start, end) -> float:
    return start.elapsed_time(end)


def _mean(xs: list):
    return None if any(x is None for x in xs) else statistics.fmean(xs)
