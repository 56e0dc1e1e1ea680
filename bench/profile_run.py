"""Per-step profile of an engine run: timeline (JSONL), torch.profiler traces, KV-sharing plot.

    with ProfileSession(llm, "runs/prof") as prof:   # what `pacore run --profile DIR` wraps the run in
        prof.label = "round1"                         # optional: tag the steps that follow
        ...llm.step() / llm.generate(...)...

On exit DIR holds:
- timeline.jsonl: a {"meta": ...} line, then one line per step: the engine's StepRecord (kind, batch
  sizes, schedule/model/sample seconds, KV blocks used/shared/logical) + the label, the time since
  the session started and the batch shape (tokens, distinct vs logical KV tokens) for bench.roofline;
- trace_<label>.json: a chrome trace (chrome://tracing, ui.perfetto.dev) of the first `trace_steps`
  steps of each label, with ranges engine.schedule / engine.model / engine.sample and one per kernel
  op (attention.paged_decode, attention.cascade_decode, ...);
- kv_blocks.png: physical KV blocks held per step (shared ones apart) next to what the same sequences
  would hold without sharing (kv_blocks_logical);
- profile_summary.json: where the time went, per label.
Patching is per instance (llm.step, llm.scheduler.schedule, ...) and undone on exit.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from bench.roofline import ModelShape, shape_of_batch

_OPS = ("store_kvcache", "paged_decode", "cascade_decode", "prefill_attention", "rmsnorm", "rope", "silu_and_mul")


def apply_threads(n: int | None) -> None:
    """Pin intra-op threads; the env vars reach threads torch starts later (transformers' CB loop)."""
    if not n:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    import torch
    torch.set_num_threads(n)


def _ranged(name: str, fn):
    from torch.profiler import record_function

    def wrapped(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)
    return wrapped


class ProfileSession:
    def __init__(self, llm, out_dir: str | os.PathLike, trace_steps: int = 8, plot: bool = True):
        self.llm, self.out_dir, self.trace_steps, self.plot = llm, Path(out_dir), trace_steps, plot
        self.label = "run"
        self.records: list[dict] = []
        self._traced: dict[str, int] = {}  # label -> steps traced so far
        self._prof = None
        self._shape = None
        self._t0 = 0.0
        self._trace_ranges: dict[str, dict] = {}

    # -- patching ----------------------------------------------------------------------------
    def __enter__(self) -> "ProfileSession":
        llm = self.llm
        self._saved_record = llm.record_steps
        llm.record_steps = True
        self._ops = llm.runner.ops
        llm.runner.ops = dataclasses.replace(
            self._ops, **{op: _ranged(f"attention.{op}" if "attention" in op or "decode" in op else f"op.{op}",
                                      getattr(self._ops, op)) for op in _OPS})
        llm.runner.run = _ranged("engine.model", llm.runner.run)
        llm._sample_and_update = _ranged("engine.sample", llm._sample_and_update)
        schedule = llm.scheduler.schedule

        def schedule_and_capture():
            batch = schedule()
            self._shape = shape_of_batch(batch, llm.block_size) if batch else None
            return batch
        llm.scheduler.schedule = _ranged("engine.schedule", schedule_and_capture)
        self._step = llm.step
        llm.step = self._profiled_step
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        llm = self.llm
        if self._prof is not None:
            self._end_trace()
        for obj, attr in ((llm, "step"), (llm, "_sample_and_update"), (llm.runner, "run"),
                          (llm.scheduler, "schedule")):
            obj.__dict__.pop(attr, None)
        llm.runner.ops = self._ops
        llm.record_steps = self._saved_record
        self.write()

    def _profiled_step(self):
        label = self.label
        if self._prof is not None and self._prof_label != label:
            self._end_trace()  # a new label (round) starts: its first steps get their own trace
        if self._prof is None and self._traced.get(label, 0) < self.trace_steps:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.llm.device.type == "cuda" else [])
            self._prof, self._prof_label = profile(activities=acts), label
            self._prof.__enter__()
        n = len(self.llm.step_log)
        out = self._step()
        if len(self.llm.step_log) > n:
            rec = self.llm.step_log[-1].to_dict()
            # Traced steps run under the profiler (slower): flagged so bench.roofline skips them.
            rec.update(label=label, t=time.perf_counter() - self._t0, traced=self._prof is not None)
            if self._shape is not None:
                rec.update(dataclasses.asdict(self._shape))
            self.records.append(rec)
            if self._prof is not None:
                self._traced[label] = self._traced.get(label, 0) + 1
                if self._traced[label] >= self.trace_steps:
                    self._end_trace()
        return out

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
                    model_shape=dataclasses.asdict(ModelShape.from_config(llm.config, elem)))

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
        return dict(labels=by_label, traced_ranges=self._trace_ranges)

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
                from bench.plots import plot_kv_timeline
                plot_kv_timeline(self.records, meta["kv_bytes_per_block"], self.out_dir / "kv_blocks.png")
            except ImportError as e:  # matplotlib is a dev extra; the timeline has the same numbers
                print(f"profile: no kv_blocks.png ({e}); pip install matplotlib", file=sys.stderr)
        return summary


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


def run_profiled(llm, problems: int, k: int, prompt_len: int, gen_len: int, out_dir=None, seed: int = 0,
                 trace_steps: int = 8) -> list[dict]:
    """P random-token prompts forked K ways, `gen_len` tokens each; returns the step records."""
    import random
    import tempfile

    from engine import SamplingParams
    rng = random.Random(seed)
    vocab = llm.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(problems)]
    llm.generate([[3, 4, 5, 6]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up, not recorded
    with ProfileSession(llm, out_dir or tempfile.mkdtemp(prefix="pacore_prof_"), trace_steps,
                        plot=out_dir is not None) as prof:
        llm.generate(prompts, SamplingParams(n=k, max_tokens=gen_len, ignore_eos=True, seed=seed), use_tqdm=False)
    return prof.records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    apply_threads(args.threads)
    from engine import LLM
    llm = LLM(args.model, dtype=args.dtype, record_steps=True)
    run_profiled(llm, args.problems, args.k, args.prompt_len, args.gen_len, out_dir=args.out)
    print(format_summary(json.loads((Path(args.out) / "profile_summary.json").read_text())))
    print(f"timeline, traces and kv_blocks.png in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
