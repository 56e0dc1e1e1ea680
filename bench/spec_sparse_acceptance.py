"""Sparse self-drafting against the sink + window at the same KV read per draft step, on the embedded model.

    python -m bench.spec_sparse_acceptance            # the figures in docs/speculative.md
    python -m bench.spec_sparse_acceptance --quick    # seconds, small

The harness of bench/spec_self_acceptance.py (round-2-shaped prompts per context bin, trajectories
sampled without speculation, then the engine's own draft step teacher-forced on them from every
``--stride``-th position, the exact acceptance chance of each rule given the token the model drew). For
each budget B (KV tokens a draft step reads besides its ``--sink``): the window alone (window B), and
the sparse policy (speculative_config ``selected``) with a recent window of each ``--recent`` fraction
of B and the rest of B in the blocks between whose key bounds score highest (Quest-style; sink, window
and selection in whole blocks, so it reads at most what the window does: its partial last block is
the same one), and the same split with the blocks the last verify pass attended to most (``selection``
"verify", Vegas-style): before each draft start, a verify pass over the depth + 1 positions before it (the
last token and the drafts a cycle that ended there accepted; reading the cache the full pass wrote) leaves
its block importance, which every draft step of the start then chooses by.

A 135M model at 8k is a weak proxy for PaCoRe-8B at 50k: what it measures is how much of its own
distribution each policy's KV keeps. The published figures: Vegas (arXiv 2602.07223, Qwen3-8B, AIME25
at ~10k context, 6 drafts): 4.92 tokens per iteration for a StreamingLLM (sink + window) draft, 5.43
Quest-style, 6.24 verification-guided.
"""
from __future__ import annotations

import argparse
import sys
import time

from bench.spec_acceptance import SUFFIX, _commit
from bench.spec_harness import _ints, harness_args, out_dir, quick_harness, save_report
from bench.spec_self_acceptance import draft_pass, reference_prompts, sampled_chunks, summarise

CAVEAT = ("SmolLM2-135M at 1-8k tokens is a weak proxy for PaCoRe-8B at ~50k: read the gap between the policies, "
          "not the levels. Published (Vegas poster, Qwen3-8B, AIME25 ~10k context, 6 drafts): 4.92 tokens per "
          "iteration StreamingLLM, 5.43 Quest-style, 6.24 Vegas.")
RULES = ("coupled", "rejection")


def configs(budgets: list[int], recent: list[float], bs: int) -> list[tuple[str, int, int, str]]:
    """(label, window, selected, selection) per budget: the window alone, then sparse splits (whole blocks)
    chosen by key bounds, then by the last verify."""
    out = []
    for b in budgets:
        out.append((f"window {b}", b, 0, ""))
        for selection, word in (("bounds", "selected"), ("verify", "verify-selected")):
            for f in recent:
                w = max(bs, round(b * f / bs) * bs)
                if w < b:
                    out.append((f"window {w} + {word} {b - w}", w, b - w, selection))
    return out


def enable_importance(llm):
    """The importance an engine with selection "verify" keeps (engine/spec/importance.py), to switch on."""
    from engine.spec.importance import BlockImportance
    r = llm.runner
    return BlockImportance(r.cfg.num_layers, r.max_num_seqs, r.max_blocks, r.device)


def verify_pass(llm, rows, depth: int) -> None:
    """The verify that ends where each row's drafts start: queries at the depth + 1 positions before its
    num_computed, reading the K/V the full pass wrote (none stored: slots -1); its block importance stays
    in the rows' buffer rows for their draft steps."""
    import torch

    from engine.worker.attention import AttentionMetadata
    from engine.worker.step_inputs import StepInputs
    n, runner = depth + 1, llm.runner
    ids = [t for r in rows for t in r.token_ids[r.num_computed - n:r.num_computed]]
    pos = [p for r in rows for p in range(r.num_computed - n, r.num_computed)]
    lens = [r.num_computed for r in rows]
    meta = AttentionMetadata(slot_mapping=torch.full((len(ids),), -1), num_prefill_tokens=0,
                             decode_seq_lens=torch.tensor(lens, dtype=torch.int32),
                             decode_cu_seqlens_q=torch.arange(0, n * len(rows) + 1, n, dtype=torch.int32),
                             decode_max_query_len=n)
    runner.execute(StepInputs(torch.tensor(ids), torch.tensor(pos), meta, torch.zeros(0, dtype=torch.long), [],
                              False, {"decode": runner._table_rows(rows, lens)}, []))


def enable_bounds(llm) -> None:
    """Give the runner its key bounds (what an engine with ``selected`` allocates), before any KV is written."""
    from pacore_kernels.block_select import allocate_key_bounds
    r, cfg = llm.runner, llm.runner.cfg
    r.key_bounds = allocate_key_bounds(cfg.num_layers, r.kv_cache.shape[2], r.model.shard.num_kv_heads, cfg.head_dim,
                                       r.dtype, r.device)


def measure(args, save=lambda res: None) -> dict:
    """The acceptance of every policy per context bin and temperature; ``save(res)`` after each cell."""
    from engine import LLM, SamplingParams
    from pacore.cli.demo import DEMO_PROBLEMS

    messages = [{"role": "user", "content": DEMO_PROBLEMS[args.problem]["question"] + SUFFIX}]
    llm = LLM(args.model, max_model_len=args.max_model_len)
    enable_bounds(llm)
    importance = enable_importance(llm)
    t0 = time.process_time()
    prompts = reference_prompts(llm, args, messages)
    log = lambda msg: print(f"[{time.process_time() - t0:6.0f} s CPU] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"prompts of {[len(p) for p in prompts]} tokens")
    cfgs = configs(args.budgets, args.recent, llm.block_size)
    res = {"bins": [], "configs": cfgs, "sink": args.sink}
    for (lo, hi), prompt in zip(args.bins, prompts):
        entry = {"context": [lo, hi], "prompt_tokens": len(prompt), "by_temperature": {}}
        for temp in args.temperatures:
            params = SamplingParams(n=args.k, temperature=temp, max_tokens=args.max_tokens, seed=args.seed)
            _, blocks, _, chunks = sampled_chunks(llm, args, prompt, params, args.depth)
            t = {"chunks": len(chunks.rows), "policies": {}}
            for label, window, selected, selection in cfgs:
                if selected:
                    llm.runner.draft_select = llm.runner.select_spans(args.sink, selected, window)
                verify = selection == "verify"
                llm.runner.importance = importance if verify else None
                before = (lambda rows: verify_pass(llm, rows, args.depth)) if verify else None
                a = draft_pass(llm, chunks, window, args.sink, args.depth, temp, args.batch, selected, before)
                t["policies"][label] = {rule: summarise(a[rule]) for rule in RULES}
            log(f"context {lo}-{hi} T={temp}: {len(chunks.rows)} draft starts, {len(cfgs)} policies")
            blocks.release()
            entry["by_temperature"][str(temp)] = t
            res["cpu_s"] = time.process_time() - t0
            save(res | {"bins": res["bins"] + [entry]})
        res["bins"].append(entry)
    return res


def verify_section(res: dict, depths: tuple[int, ...] = (4, 6)) -> dict:
    """spec_profile.json's ``self_verify`` section, shaped as ``self_sparse``: per temperature, rule and
    "window/selected/sink", per context bin, tokens per verify at each depth as [window alone, verify-guided]
    at the same read (the rehearsal reads only their ratio)."""
    profiles: dict = {}
    for b in res["bins"]:
        for temp, t in b["by_temperature"].items():
            for label, window, selected, selection in res["configs"]:
                if selection != "verify":
                    continue
                alone = t["policies"][f"window {window + selected}"]
                for rule in RULES:
                    a, v = alone[rule]["tokens_per_verify"], t["policies"][label][rule]["tokens_per_verify"]
                    tpv = {str(d): [round(a[d - 1], 2), round(v[d - 1], 2)] for d in depths if d <= len(a)}
                    profiles.setdefault(temp, {}).setdefault(rule, {}).setdefault(
                        f"{window}/{selected}/{res['sink']}", []).append(
                        {"context": b["context"], "window": f"{window + selected}/{res['sink']}", "tokens_per_verify": tpv})
    return {"model": res.get("model") or "smollm2-135m", "note": VERIFY_NOTE, "command": res["command"],
            "commit": res["commit"], "profiles": profiles}


VERIFY_NOTE = ("Tokens per verify step at 4 and 6 drafts, [window alone, verify-guided selection], at the same KV read "
               "per draft step: bench.spec_sparse_acceptance's verify-selected rows (measured on a CPU, SmolLM2-135M, "
               "1-8k contexts). A weak proxy for an 8B model at 50k: read only the ratio verify-guided / window.")


def write_verify_section(report: Path, profile: Path) -> None:
    """Put the self_verify section of a run's report.json into the profile JSON, keeping its other sections."""
    raw = json.loads(profile.read_text()) if profile.is_file() else {}
    raw["self_verify"] = verify_section(json.loads(report.read_text()))
    profile.write_text(json.dumps(raw, indent=1) + "\n")


def table(res: dict, depths: tuple[int, ...] = (4, 6)) -> str:
    head = ("| T | context | KV read per draft step | policy | coupled: accept 1st / tokens per verify at "
            + " / ".join(map(str, depths)) + " drafts | rejection |")
    lines = [head, "|" + "---|" * 6]
    for temp in sorted({t for b in res["bins"] for t in b["by_temperature"]}, reverse=True):
        for b in res["bins"]:
            t = b["by_temperature"].get(temp)
            if t is None:  # a run cut short
                continue
            for label, window, selected, _ in res["configs"]:
                cells = []
                for rule in RULES:
                    s = t["policies"][label][rule]
                    tpv = [s["tokens_per_verify"][d - 1] for d in depths if d <= len(s["tokens_per_verify"])]
                    cells.append(" / ".join(f"{x:.2f}" for x in [s["accept"][0], *tpv]))
                lo, hi = b["context"]
                lines.append(f"| {temp} | {lo}-{hi} | {res['sink']} + {window + selected} | {label} | "
                             f"{cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spec_sparse_acceptance", description=__doc__.split("\n")[0])
    harness_args(p, k=2, max_tokens=128)
    p.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.6])
    p.add_argument("--budgets", type=_ints, default=[128, 512], help="KV tokens per draft step besides the sink")
    p.add_argument("--recent", type=lambda s: [float(x) for x in s.split(",")], default=[0.25, 0.5],
                   help="the sparse policy's recent window, as fractions of the budget")
    p.add_argument("--sink", type=int, default=16)
    p.add_argument("--out", default="runs/spec_sparse_acceptance")
    p.add_argument("--profile", default=None, help="also write the self_verify section into this profile JSON "
                   "(bench/rehearsal/spec_profile.json)")
    args = p.parse_args(argv)
    if args.quick:
        quick_harness(args)
        args.budgets, args.depth, args.stride = [64], 4, 2
    out = out_dir(args)
    meta = {"command": " ".join(["python -m bench.spec_sparse_acceptance", *sys.argv[1:]]), "commit": _commit(),
            "note": CAVEAT, "model": args.model}

    def save(res: dict) -> str:
        return save_report(out, res, meta, CAVEAT, table(res))
    print(save(measure(args, save)))
    if args.profile:
        write_verify_section(out / "report.json", Path(args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
