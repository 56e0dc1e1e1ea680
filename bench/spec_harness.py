"""What the teacher-forced acceptance benches share besides bench/spec_self_acceptance.py's harness itself
(bench.spec_self_acceptance, bench.spec_sparse_acceptance, bench.spec_layerskip_acceptance): their common
arguments, --quick's harness settings, and the report they rewrite after every cell."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pairs(s: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in part.split("-")) for part in s.split(",")]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",")]


def harness_args(p: argparse.ArgumentParser, k: int, max_tokens: int) -> None:
    """The arguments of the teacher-forced harness (bench/spec_self_acceptance.py) every bench on it takes."""
    p.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--problem", type=int, default=0, help="index of the demo problem (pacore/cli/demo.py)")
    p.add_argument("--refs-k", type=int, default=32, help="round 1's trajectories, the references (the 'high' K)")
    p.add_argument("--refs-tokens", type=int, default=384, help="round 1's max_tokens")
    p.add_argument("--bins", type=_pairs, default=[(1024, 2048), (2048, 4096), (4096, 8192)],
                   help="context bins lo-hi,...: a prompt per bin reaching a quarter into it")
    p.add_argument("--k", type=int, default=k, help="trajectories per bin and temperature")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens sampled per trajectory")
    p.add_argument("--depth", type=int, default=6, help="draft steps per start (num_speculative_tokens 1..depth)")
    p.add_argument("--stride", type=int, default=4, help="a draft start every STRIDE positions")
    p.add_argument("--batch", type=int, default=64, help="draft rows per step")
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a shared 2-core VM, 2 threads spin against each other)")
    p.add_argument("--quick", action="store_true", help="small: the shapes in seconds")


def quick_harness(args) -> None:
    """--quick's harness: a 1k context, bins where its prompts (a few hundred tokens) fall (reference_prompts)."""
    args.max_model_len, args.refs_k, args.refs_tokens, args.bins, args.k, args.max_tokens = 1024, 16, 16, None, 2, 24


def out_dir(args) -> Path:
    """Where a bench on this harness writes (OUT, made), torch's threads set first."""
    from bench.profile_run import apply_threads
    apply_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def save_report(out: Path, res: dict, meta: dict, caveat: str, table: str) -> str:
    """OUT/report.json and OUT/table.md (the caveat, the table, the CPU time so far), written after every cell
    of a run so that one cut short keeps what it measured; returns the table's text."""
    (out / "report.json").write_text(json.dumps(res | meta, indent=1))
    text = caveat + "\n\n" + table + f"\n\nCPU time: {res['cpu_s']:.0f} s\n"
    (out / "table.md").write_text(text)
    return text
