"""Per-step profile of an engine run, as a StepObserver: timeline (JSONL), torch.profiler traces,
KV-sharing plot. Used by `pacore run --profile DIR` and bench/ alike.

    with ProfileSession(llm, "runs/prof") as prof:   # attaches itself with llm.add_observer
        prof.label = "round1"                         # optional: tag the steps that follow
        ...llm.step() / llm.generate(...)...

On exit DIR holds:
- timeline.jsonl: a {"meta": ...} line, then one line per step: the engine's StepRecord (kind, batch
  sizes, schedule/model/sample seconds, KV blocks used/shared/logical) + the label, the time since
  the session started and the step's shape (engine/core/step_shape.py: tokens, distinct vs logical KV
  tokens) for bench.roofline; and the step's mix: ``rounds`` ({"1": {"prefill_tokens", "decode_tokens",
  "problems"}, ...}) and ``problems`` (distinct problems in the step), read from request ids that end
  in ``#rN`` (round N of problem KEY: PaCoRe's, pacore/results/keys.py). A step of one round is
  labelled ``round<N>``, of several ``mixed``; one without such ids keeps ``label`` ("run");
- trace_<label>.json: with trace_steps > 0, a chrome trace (chrome://tracing, ui.perfetto.dev) of
  up to `trace_steps` steps of each label (from its second step on: a step's label is known once it is
  planned, after the trace had to start), with ranges engine.schedule / engine.model / engine.sample
  and one per kernel op (attention.paged_decode, attention.cascade_decode, ...), which the engine marks
  while a ranges-wanting observer is attached; tens of MB per label;
- kv_blocks.png: physical KV blocks held per step (shared ones apart) next to what the same sequences
  would hold without sharing (kv_blocks_logical); needs matplotlib (a base dependency);
- profile_summary.json: where the time went, per label (``labels``), per round (``rounds``: its tokens,
  the steps it ran in and their wall span, decode tokens over that span) and in the traces.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from engine.core.observers import StepObserver, StepRecord
from engine.core.step_shape import ModelShape, shape_of_plan


class ProfileSession(StepObserver):
    """Records every step of the engine it is attached to (a context manager); see the module doc."""

    ranges = True

    def __init__(self, llm, out_dir: str | os.PathLike, trace_steps: int = 8, plot: bool = True):
        self.llm, self.out_dir, self.trace_steps, self.plot = llm, Path(out_dir), trace_steps, plot
        self.ranges = trace_steps > 0  # the engine marks its ops for the traces: no traces, no marks
        self.label = "run"
        self.records: list[dict] = []
        self._traced: dict[str, int] = {}  # label -> steps traced so far
        self._prof = None
        self._shape = None
        self._mix: tuple[dict, int] = ({}, 0)
        self._round_label: str | None = None  # the last step's round label: a trace starting now is filed under it
        self._t0 = 0.0
        self._trace_ranges: dict[str, dict] = {}

    def __enter__(self) -> "ProfileSession":
        self._t0 = time.perf_counter()
        self.llm.add_observer(self)
        return self

    def __exit__(self, *exc) -> None:
        self.llm.remove_observer(self)
        if self._prof is not None:
            self._end_trace()
        self.write()

    # -- StepObserver ------------------------------------------------------------------------
    def step_started(self) -> None:
        label = self._round_label or self.label
        if self._prof is not None and self._prof_label != label:
            self._end_trace()  # a new label (round) starts: its first steps get their own trace
        if self._prof is None and label not in self._traced and self.trace_steps > 0:  # once each: no overwrite
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.llm.device.type == "cuda" else [])
            self._prof, self._prof_label = profile(activities=acts), label
            self._prof.__enter__()

    def step_planned(self, plan) -> None:
        self._shape = shape_of_plan(plan, self.llm.block_size)
        self._mix = step_mix(plan)

    def step_finished(self, record: StepRecord) -> None:
        rec = record.to_dict()
        rounds, problems = self._mix
        label = self.label if not rounds else f"round{next(iter(rounds))}" if len(rounds) == 1 else "mixed"
        self._round_label = label if rounds else None
        # Traced steps run under the profiler (slower): flagged so bench.roofline skips them.
        rec.update(label=label, t=time.perf_counter() - self._t0, traced=self._prof is not None)
        if rounds:
            rec.update(rounds=rounds, problems=problems)
        rec.update(dataclasses.asdict(self._shape))
        self.records.append(rec)
        if self._prof is not None:
            self._traced[self._prof_label] = self._traced.get(self._prof_label, 0) + 1
            if self._traced[self._prof_label] >= self.trace_steps:
                self._end_trace()

    def _end_trace(self) -> None:
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out_dir / f"trace_{_safe(self._prof_label)}.json"))
        ranges = {}
        for e in prof.key_averages():
            if e.key.startswith(("engine.", "attention.", "op.")):
                ranges[e.key] = dict(calls=e.count, cpu_ms=e.cpu_time_total / 1e3,
                                     device_ms=getattr(e, "device_time_total", 0.0) / 1e3)
        self._trace_ranges[self._prof_label] = ranges

    # -- output ------------------------------------------------------------------------------
    def meta(self) -> dict:
        import torch
        llm = self.llm
        elem = torch.empty((), dtype=llm.dtype).element_size()
        return dict(model=str(llm.config.path), device=llm.device.type, dtype=str(llm.dtype).split(".")[-1],
                    block_size=llm.block_size, kv_bytes_per_block=llm.kv_bytes_per_block,
                    model_shape=dataclasses.asdict(ModelShape.from_config(llm.config, elem,
                                                                          llm.runner.kv_dtype.itemsize)))

    def summary(self) -> dict:
        by_label: dict[str, dict] = {}
        for r in self.records:
            s = by_label.setdefault(r["label"], dict(steps=0, tokens=0, schedule_s=0.0, model_s=0.0, sample_s=0.0,
                                                     decode_steps=0, peak_blocks_used=0, peak_blocks_logical=0))
            s["steps"] += 1
            s["tokens"] += r["num_tokens"]
            s["decode_steps"] += r["kind"] == "decode"
            for k in ("schedule_s", "model_s", "sample_s"):
                s[k] += r[k]
            s["peak_blocks_used"] = max(s["peak_blocks_used"], r["kv_blocks_used"])
            s["peak_blocks_logical"] = max(s["peak_blocks_logical"], r["kv_blocks_logical"])
        for s in by_label.values():
            total = s["schedule_s"] + s["model_s"] + s["sample_s"]
            s["host_share"] = (s["schedule_s"] + s["sample_s"]) / total if total else 0.0
        return dict(labels=by_label, rounds=rounds_summary(self.records), traced_ranges=self._trace_ranges)

    def write(self) -> dict:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        meta = self.meta()
        with open(self.out_dir / "timeline.jsonl", "w") as f:
            f.write(json.dumps({"meta": meta}) + "\n")
            for r in self.records:
                f.write(json.dumps(r) + "\n")
        summary = self.summary()
        (self.out_dir / "profile_summary.json").write_text(json.dumps(summary, indent=1))
        if self.plot and self.records:
            try:
                plot_kv_timeline(self.records, meta["kv_bytes_per_block"], self.out_dir / "kv_blocks.png")
            except ImportError as e:  # matplotlib missing (a base dependency); the timeline has the same numbers
                print(f"profile: no kv_blocks.png ({e}); pip install matplotlib", file=sys.stderr)
        return summary


def profiled(llm, profile_dir: str | None, trace_steps: int = 0):
    """A ProfileSession around ``llm`` when ``profile_dir`` is set (chrome traces only with
    ``trace_steps``: they are tens of MB each), else a context that does nothing."""
    return ProfileSession(llm, profile_dir, trace_steps) if profile_dir else nullcontext()


def round_of(request_id: str) -> tuple[str, str] | None:
    """(round, problem) of a request id ``KEY[#...]#rN`` (PaCoRe's: pacore/results/keys.py), else None."""
    problem, _, last = request_id.rpartition("#")
    if not problem or last[:1] != "r" or not last[1:].isdigit():
        return None
    return last[1:], problem.partition("#")[0]


def step_mix(plan) -> tuple[dict, int]:
    """The rounds a step's tokens belong to ({round: {prefill_tokens, decode_tokens, problems}}) and its
    distinct problems; ({}, 0) when its request ids carry no round."""
    rounds: dict[str, dict] = {}
    seen: dict[str, set] = {}
    rows = [(seq, n, "prefill_tokens") for seq, n in plan.prefills]
    rows += [(seq, 1 + len(plan.drafts.get(seq.seq_id, ())), "decode_tokens") for seq in plan.decodes]
    for seq, n, kind in rows:
        found = round_of(seq.request.request_id)
        if found is None:
            continue
        r = rounds.setdefault(found[0], {"prefill_tokens": 0, "decode_tokens": 0, "problems": 0})
        r[kind] += n
        seen.setdefault(found[0], set()).add(found[1])
    for key, problems in seen.items():
        rounds[key]["problems"] = len(problems)
    return dict(sorted(rounds.items(), key=lambda kv: int(kv[0]))), len(set().union(*seen.values()))


def rounds_summary(records: list[dict]) -> dict:
    """Per round: its tokens, the steps it ran in, their wall span (first such step's start to the last
    one's end) and decode tokens over that span: the round's throughput, as the run summary's tok/s."""
    out: dict[str, dict] = {}
    for r in records:
        start = r["t"] - (r["schedule_s"] + r["model_s"] + r["sample_s"])
        for key, mix in r.get("rounds", {}).items():
            s = out.setdefault(key, {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "start": start})
            s["steps"] += 1
            s["prefill_tokens"] += mix["prefill_tokens"]
            s["decode_tokens"] += mix["decode_tokens"]
            s["end"] = r["t"]
    for s in out.values():
        s["span_s"] = s.pop("end") - s.pop("start")
        s["decode_tokens_per_s"] = s["decode_tokens"] / s["span_s"] if s["span_s"] > 0 else None
    return out


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


def format_summary(summary: dict) -> str:
    lines = [f"{'label':12}{'steps':>7}{'tokens':>8}{'sched s':>9}{'model s':>9}{'sample s':>9}{'host %':>8}"
             f"{'peak KV blocks':>16}{'no sharing':>12}"]
    for label, s in summary["labels"].items():
        lines.append(f"{label:12}{s['steps']:>7}{s['tokens']:>8}{s['schedule_s']:>9.2f}{s['model_s']:>9.2f}"
                     f"{s['sample_s']:>9.2f}{s['host_share']:>8.1%}{s['peak_blocks_used']:>16}"
                     f"{s['peak_blocks_logical']:>12}")
    for label, ranges in summary["traced_ranges"].items():
        model = ranges.get("engine.model", {}).get("cpu_ms", 0.0)
        attn = sum(v["cpu_ms"] for k, v in ranges.items() if k.startswith("attention."))
        if model:
            lines.append(f"trace {label}: attention ops {attn:.1f} ms of {model:.1f} ms model time "
                         f"({attn / model:.0%}), schedule {ranges.get('engine.schedule', {}).get('cpu_ms', 0):.1f} ms, "
                         f"sample {ranges.get('engine.sample', {}).get('cpu_ms', 0):.1f} ms")
    return "\n".join(lines)


def plot_kv_timeline(records: list[dict], bytes_per_block: int, path: str | Path, title: str = "") -> None:
    """KV held per step: physical blocks (split shared / unique) vs the no-sharing (logical) count.
    Round / label boundaries are marked."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    steps = list(range(len(records)))
    mib = bytes_per_block / 2**20
    used = [r["kv_blocks_used"] * mib for r in records]
    shared = [r["kv_blocks_shared"] * mib for r in records]
    logical = [r["kv_blocks_logical"] * mib for r in records]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.fill_between(steps, 0, shared, step="post", alpha=0.5, label="held: shared blocks (ref count > 1)")
    ax.fill_between(steps, shared, used, step="post", alpha=0.5, label="held: unique blocks")
    ax.plot(steps, logical, drawstyle="steps-post", color="black", lw=1.2, label="without sharing (logical)")
    prev = None
    for i, r in enumerate(records):
        label = r.get("label")
        if label != prev:
            ax.axvline(i, color="grey", ls=":", lw=0.8)
            ax.text(i, max(logical + [1e-9]) * 0.98, f" {label}", fontsize=7, va="top")
            prev = label
    ax.set_xlabel("engine step")
    ax.set_ylabel("KV cache (MiB)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.9))
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
