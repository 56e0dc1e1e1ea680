"""Data-parallel replicas against one: the same PaCoRe workload on 1 replica and on N, tokens/s of each.

Every configuration goes through the same driver (pacore/replicas/driver.py), so the only difference is the
replicas: one process with all the cores, or N processes that split them (or N Ray actors with
--ray). Tokens/s is the session's generated tokens over the span from the first replica ready to the
end (model loading excluded, as in the run summary).

    python -m bench.replicas [--model DIR] [--problems 8] [--rounds 4] [--max-tokens 32] [--replicas 2] [--ray]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile

from pacore.cli import build_llm
from pacore.config import RunConfig, parse_rounds
from pacore.cli.demo import demo_records


def workload(path: str, problems: int) -> None:
    """``problems`` problems cycling through the demo's, each with an id of its own."""
    records = demo_records()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(problems):
            rec = dict(records[i % len(records)], id=f"p{i}")
            f.write(json.dumps(rec) + "\n")


def measure(cfg: RunConfig, replicas: int, ray: bool) -> dict:
    out = tempfile.mkdtemp(prefix="pacore_replicas_")
    run = dataclasses.replace(cfg, out_path=os.path.join(out, "results.jsonl"))
    if ray:
        from pacore.replicas.ray_actors import run_on_ray

        summary = run_on_ray(run, build_llm, replicas=replicas)
    else:
        from pacore.replicas.processes import run_data_parallel

        summary = run_data_parallel(run, replicas, build_llm)
    s = summary["run"]
    return {"replicas": replicas, "transport": "ray" if ray else "processes", "tokens": s["generated_tokens"],
            "wall_s": s["wall_time_s"], "tok_s": s["tokens_per_s"],
            "handed": s["dispatch"]["problems_per_replica"], "completed": summary["completed"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--rounds", default="4", help="K per round before the final K=1 round (default 4)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-problems-in-flight", type=int, default=2,
                    help="per replica; small, so that a few problems still spread over the replicas")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--ray", action="store_true", help="also run the N replicas as actors of a local Ray cluster")
    args = ap.parse_args(argv)
    data = os.path.join(tempfile.mkdtemp(prefix="pacore_replicas_"), "problems.jsonl")
    workload(data, args.problems)
    options = {"model": args.model} if args.model else {}
    cfg = RunConfig(data_path=data, out_path="", rounds=parse_rounds(args.rounds), max_tokens=args.max_tokens,
                    temperature=0.7, max_problems_in_flight=args.max_problems_in_flight, show_progress=False,
                    engine_options=options)
    results = [measure(cfg, 1, False), measure(cfg, args.replicas, False)]
    if args.ray:
        results.append(measure(cfg, args.replicas, True))
    print(f"workload: {args.problems} problems, K {list(cfg.schedule)}, {args.max_tokens} tokens per trajectory, "
          f"{args.model or 'SmolLM2-135M (embedded)'}, {os.cpu_count()} cores")
    for r in results:
        print(f"{r['replicas']} replica{'s' if r['replicas'] > 1 else ' '} ({r['transport']:9}) {r['tokens']:6d} tokens "
              f"in {r['wall_s']:6.1f} s = {r['tok_s']:6.1f} tok/s   problems handed to each: {r['handed']}")
    for r in results[1:]:
        print(f"ratio {r['replicas']} {r['transport']} / 1: {r['tok_s'] / results[0]['tok_s']:.2f}x tokens/s")
    return 0 if all(r["completed"] == args.problems for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
