"""The host's real time per engine step at PaCoRe-8B's shape, beside the modelled H200 step.

    python -m bench.rehearsal.host            # the table: batch 32 / 128 / 256 with the cache full, 4 x 128k
    python -m bench.rehearsal.host --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'

Each case fills a rehearsed engine's cache (the real block count of one H200) with ``batch``
sequences of ``context`` tokens, then times decode steps: the scheduler, ``ModelRunner.prepare`` and
the sampling/postprocess phase (stop checks, finishing), measured on this CPU. The device step is
the device model's. Host work must grow with the batch, not the context, and stay under 10% of the
device step. With ``--speculative-config`` the n-gram drafter runs for real: a scripted trajectory
is filler, so every row drafts from its own tokens and every draft is accepted, but the most recent
match of a run of one repeated token is followed by one token only: the drafts are 1 token long. With
``--spec-acceptance 1`` the rehearsal's scripted drafter proposes full drafts instead, all accepted:
the most tokens a step can append and check per row. The device step is then a verify step's.
With self-drafting (method "self_window") the engine's draft steps run with their inputs prepared for
real and their draws scripted: every draft right (the script's tokens), or accepted with probability
P (``--spec-acceptance P``); the device step then includes its draft steps.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from bench.rehearsal.shapes import model_folder

# (batch, context): a full H200 cache of PaCoRe-8B (~786k tokens) at three batch sizes, and round 2's
# few long trajectories.
CASES = [(32, 24_000), (128, 6_000), (256, 3_000), (4, 128_000)]


def filled_engine(batch: int, context: int, folder: Path, shape: str = "qwen3-8b",
                  speculative_config: dict | None = None):
    """A rehearsed engine decoding ``batch`` sequences of ``context`` tokens, its cache nearly full
    (with speculative_config: each request's prompt indexed by the drafter already; with self-drafting,
    room for 64 steps of full drafts, which start once every prompt is in)."""
    from engine import LLM, SamplingParams
    model = model_folder(shape, folder)
    self_drafting = (speculative_config or {}).get("method") == "self_window"
    growth = 4 * (speculative_config.get("num_speculative_tokens", 4) + 1) if self_drafting else 0
    per_seq = -(-context // 16) + 8 + growth  # room for a few blocks of growth each
    blocks = batch * per_seq * 102 // 100 + 16  # and the 1% the scheduler keeps free when it admits
    llm = LLM(str(model), tokenizer=str(model / "tokenizer"), device_model="h200", num_kv_blocks=blocks,
              max_num_seqs=max(batch, 1), max_num_batched_tokens=16384, record_steps=True,
              speculative_config=speculative_config)
    for i in range(batch):
        prompt = [100 + (i * 7919 + j) % 40000 for j in range(context - 1)]  # distinct: no prefix hits
        llm.add_request(prompt, SamplingParams(max_tokens=1024, ignore_eos=True), request_id=f"s{i}")
    speculator = llm.scheduler.speculator
    if self_drafting:  # a row decoding while the others' prompts go in would draft past its room
        llm.scheduler.speculator = None
    while len(llm.scheduler.running) < batch or any(s.num_generated == 0 for s in llm.scheduler.running):
        llm.step()
    llm.scheduler.speculator = speculator
    if speculative_config:
        llm.step()  # the first drafts index each prompt once (per request, not per step)
    return llm


class _Timed:
    """Seconds spent in a callable (time.perf_counter, which --cpu-time replaces)."""

    def __init__(self, fn):
        self.fn, self.s = fn, 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.s += time.perf_counter() - t0


def measure(llm, steps: int = 64) -> dict:
    """Mean milliseconds per decode step of each host phase, and of the modelled device step. With
    self-drafting, "draft" is its draft steps' host work outside their inputs (drawing, bookkeeping:
    engine/spec/self_window.py); the inputs of each draft step are in "prepare"."""
    spec, runner = llm.speculator, llm.runner
    drafting = spec is not None and spec.self_drafting
    if drafting:  # the draft steps run inside the engine's model phase: timed on their own
        spec.draft_with_model = outer = _Timed(spec.draft_with_model)
        runner.run_draft = inner = _Timed(runner.run_draft)
    first = len(llm.step_log)
    for _ in range(steps):
        llm.step()
    log, ledger = llm.step_log[first:], llm.runner.ledger.steps[first:]
    schedule = statistics.mean(r.schedule_s for r in log) * 1e3
    prepare = statistics.mean(s.prepare_s for s in ledger) * 1e3
    sample = statistics.mean(r.sample_s for r in log) * 1e3
    device = statistics.mean(s.cost.total for s in ledger) * 1e3
    draft = (outer.s - inner.s) * 1e3 / steps if drafting else 0.0
    if drafting:
        del spec.draft_with_model, runner.run_draft
    host = schedule + prepare + sample + draft
    return {"schedule_ms": schedule, "prepare_ms": prepare, "sample_ms": sample, "draft_ms": draft, "host_ms": host,
            "device_ms": device, "host_share": host / device, "decodes": log[-1].num_decode_seqs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal.host", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--speculative-config", type=json.loads, metavar="JSON", help="speculative decoding on")
    p.add_argument("--batch", type=int, action="append", help="only the cases of these batch sizes")
    p.add_argument("--spec-acceptance", type=float, metavar="P",
                   help="with --speculative-config: drafts of num_speculative_tokens from the rehearsal's scripted "
                        "drafter, each accepted with probability P, in place of the n-gram drafter (P=1: the most "
                        "tokens a step appends and checks)")
    p.add_argument("--cpu-time", action="store_true",
                   help="time the phases in this thread's CPU time, not the wall clock (which on a shared VM "
                        "counts the time other jobs hold the cores)")
    args = p.parse_args(argv)
    print("| batch | context | schedule ms | prepare ms | sample+postprocess ms | draft ms | host ms | modelled H200 "
          "step ms | host / device |\n|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for batch, context in CASES:
            if args.batch and batch not in args.batch:
                continue
            llm = filled_engine(batch, context, Path(tmp), speculative_config=args.speculative_config)
            if args.spec_acceptance is not None:
                from engine.rehearsal.drafter import (KINDS, DraftProfile, WindowProfile, use_scripted_drafter,
                                                      use_scripted_self_drafts)
                nst = llm.speculator.config.num_speculative_tokens
                if llm.speculator.self_drafting:
                    use_scripted_self_drafts(llm, WindowProfile.flat(args.spec_acceptance, nst))
                else:
                    use_scripted_drafter(llm, dict.fromkeys(KINDS, DraftProfile.flat(args.spec_acceptance, nst)))
            # the engine's step timers call time.perf_counter
            with mock.patch("time.perf_counter", time.thread_time) if args.cpu_time else contextlib.nullcontext():
                m = measure(llm, args.steps)
            print(f"| {batch} | {context:,} | {m['schedule_ms']:.2f} | {m['prepare_ms']:.2f} | {m['sample_ms']:.2f} | "
                  f"{m['draft_ms']:.2f} | {m['host_ms']:.2f} | {m['device_ms']:.1f} | {100 * m['host_share']:.1f}% |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
