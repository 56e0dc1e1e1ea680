"""The host's real time per engine step at PaCoRe-8B's shape, beside the modelled H200 step.

    python -m bench.rehearsal.host            # the table: batch 32 / 128 / 256 with the cache full, 4 x 128k

Each case fills a rehearsed engine's cache (the real block count of one H200) with ``batch``
sequences of ``context`` tokens, then times decode steps: the scheduler, ``ModelRunner.prepare`` and
the sampling/postprocess phase (stop checks, finishing), measured on this CPU. The device step is
the device model's. Host work must grow with the batch, not the context, and stay under 10% of the
device step.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench.rehearsal.shapes import model_folder

# (batch, context): a full H200 cache of PaCoRe-8B (~786k tokens) at three batch sizes, and round 2's
# few long trajectories.
CASES = [(32, 24_000), (128, 6_000), (256, 3_000), (4, 128_000)]


def filled_engine(batch: int, context: int, folder: Path, shape: str = "qwen3-8b"):
    """A rehearsed engine decoding ``batch`` sequences of ``context`` tokens, its cache nearly full."""
    from engine import LLM, SamplingParams
    model = model_folder(shape, folder)
    per_seq = -(-context // 16) + 8  # room for a few blocks of growth each
    blocks = batch * per_seq * 102 // 100 + 16  # and the 1% the scheduler keeps free when it admits
    llm = LLM(str(model), tokenizer=str(model / "tokenizer"), device_model="h200", num_kv_blocks=blocks,
              max_num_seqs=max(batch, 1), max_num_batched_tokens=16384, record_steps=True)
    for i in range(batch):
        prompt = [100 + (i * 7919 + j) % 40000 for j in range(context - 1)]  # distinct: no prefix hits
        llm.add_request(prompt, SamplingParams(max_tokens=1024, ignore_eos=True), request_id=f"s{i}")
    while len(llm.scheduler.running) < batch or any(s.num_generated == 0 for s in llm.scheduler.running):
        llm.step()
    return llm


def measure(llm, steps: int = 64) -> dict:
    """Mean milliseconds per decode step of each host phase, and of the modelled device step."""
    first = len(llm.step_log)
    for _ in range(steps):
        llm.step()
    log, ledger = llm.step_log[first:], llm.runner.ledger.steps[first:]
    schedule = statistics.mean(r.schedule_s for r in log) * 1e3
    prepare = statistics.mean(s.prepare_s for s in ledger) * 1e3
    sample = statistics.mean(r.sample_s for r in log) * 1e3
    device = statistics.mean(s.cost.total for s in ledger) * 1e3
    host = schedule + prepare + sample
    return {"schedule_ms": schedule, "prepare_ms": prepare, "sample_ms": sample, "host_ms": host,
            "device_ms": device, "host_share": host / device, "decodes": log[-1].num_decode_seqs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rehearsal.host", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=64)
    args = p.parse_args(argv)
    print("| batch | context | schedule ms | prepare ms | sample+postprocess ms | host ms | modelled H200 step ms "
          "| host / device |\n|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for batch, context in CASES:
            m = measure(filled_engine(batch, context, Path(tmp)), args.steps)
            print(f"| {batch} | {context:,} | {m['schedule_ms']:.2f} | {m['prepare_ms']:.2f} | {m['sample_ms']:.2f} | "
                  f"{m['host_ms']:.2f} | {m['device_ms']:.1f} | {100 * m['host_share']:.1f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
