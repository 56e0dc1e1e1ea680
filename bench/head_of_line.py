"""How long a short request waits behind a heavy one, first come first served and with the fair share.

A server with ``--max-num-seqs 8`` (issue 38): a 2-token request sent just after a heavy request
(one with n=24 and max_tokens=40, or one 7,701-token prompt) and alone. Each case runs in one engine
in this process: the heavy request, one step, then the short one; the engine steps until both end.
The table gives the short request's latency (arrival to last token) in steps and seconds, and the
heavy one's, under two policies: ``fcfs`` (``long_prefill_token_threshold=0`` and
``max_num_seqs_per_request=8``: the scheduler before engine/core/fairness.py) and ``fair`` (the defaults).

    python -m bench.head_of_line                 # PaCoRe-8B's shape on a modelled H200 (virtual seconds)
    python -m bench.head_of_line --device cpu    # the embedded SmolLM2-135M on this CPU (measured seconds)
    python -m bench.head_of_line --device cpu --short-only   # the same, each case ended with the short request

``--device h200`` is the rehearsal's engine (engine/rehearsal/): the scheduler, block manager and
runner's inputs for real, each step's time modelled; ``--device cpu`` runs the model (slow: the
7,701-token prompt is minutes of prefill on a small CPU).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

SEATS = 8
SHORT = [100 + i for i in range(24)]  # a short chat prompt's length, in token ids
POLICIES = {"fcfs": dict(long_prefill_token_threshold=0, max_num_seqs_per_request=SEATS), "fair": {}}


def cases() -> dict[str, tuple[list[int], dict] | None]:
    """Case name -> (heavy prompt, its SamplingParams keywords), or None for the short request alone."""
    return {"alone": None,
            "behind n=24, max_tokens=40": ([200 + i for i in range(24)], dict(n=24, max_tokens=40)),
            "behind a 7,701-token prompt": ([300 + i % 20000 for i in range(7701)], dict(max_tokens=40))}


def make_llm(device: str, folder: Path, **policy):
    from engine import LLM
    if device == "cpu":
        return LLM(None, max_num_seqs=SEATS, num_kv_blocks=4096, **policy)
    from bench.rehearsal.shapes import model_folder
    model = model_folder("qwen3-8b", folder)
    return LLM(str(model), tokenizer=str(model / "tokenizer"), device_model="h200", max_num_seqs=SEATS, **policy)


def run_case(llm, heavy: tuple[list[int], dict] | None, short_only: bool = False) -> dict:
    """Latency of the short request (and the heavy one, unless ``short_only``: then the heavy one is
    aborted once the short one ends) in steps and in the engine's clock's seconds."""
    from engine import SamplingParams
    steps, done = 0, {}
    if heavy is not None:
        prompt, kwargs = heavy
        llm.add_request(prompt, SamplingParams(temperature=1.0, seed=0, ignore_eos=True, **kwargs), request_id="heavy")
        llm.step()
        steps = 1
    llm.add_request(SHORT, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), request_id="short")
    start_step = steps
    t0 = time.perf_counter()
    while llm.has_unfinished():
        for out in llm.step():
            done[out.request_id] = (steps + 1, out.metrics.finished_time - out.metrics.arrival_time)
        steps += 1
        if short_only and "short" in done and llm.has_unfinished():
            llm.abort_request("heavy")
    short_steps, short_s = done["short"]
    row = {"short_steps": short_steps - start_step, "short_s": short_s, "wall_s": time.perf_counter() - t0,
           "preemptions": llm.scheduler.num_preemptions}
    if "heavy" in done:
        row["heavy_steps"], row["heavy_s"] = done["heavy"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("h200", "cpu"), default="h200",
                    help="h200: PaCoRe-8B's shape on a modelled H200 (default); cpu: the embedded model here")
    ap.add_argument("--short-only", action="store_true",
                    help="stop each case when the short request ends (no heavy columns): for a slow CPU")
    args = ap.parse_args(argv)
    unit = "virtual s" if args.device == "h200" else "s"
    print(f"| case | policy | short: steps | short: {unit} | heavy: steps | heavy: {unit} | preemptions |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, heavy in cases().items():
            for policy, knobs in POLICIES.items():
                r = run_case(make_llm(args.device, Path(tmp), **knobs), heavy, args.short_only)
                heavy_cols = (f"{r['heavy_steps']} | {r['heavy_s']:.3f}" if "heavy_steps" in r else " | ")
                print(f"| {name} | {policy} | {r['short_steps']} | {r['short_s']:.3f} | {heavy_cols} | "
                      f"{r['preemptions']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
