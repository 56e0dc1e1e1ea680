"""Layer-skipping self-drafts (speculative_config ``draft_layers``) against full-depth ones at the same
window, sink and depth, on the embedded model; the ``self_layerskip`` section of the profile the rehearsal reads.

    python -m bench.spec_layerskip_acceptance            # the figures in docs/speculative.md
    python -m bench.spec_layerskip_acceptance --quick    # seconds, small

The harness of bench/spec_self_acceptance.py (round-2-shaped prompts per context bin, trajectories
sampled without speculation, then the engine's own draft step teacher-forced on them from every
``--stride``-th position, the exact acceptance chance of each rule given the token the model drew), run
once with every layer and once per ``--keep`` fraction of the layers (engine/spec/layer_skip.py: the first
and last halves kept, a middle block skipped); ``--spread`` adds, for comparison only, drafts that keep as
many layers spread evenly from the first to the last.

A draft step that runs a fraction f of the layers reads f of the weights; whether that pays depends on
how much acceptance it costs: the ratio of tokens per verify step (layer-skip / full depth) is what the
rehearsal reads.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.spec_acceptance import DEFAULT_PROFILE, SUFFIX, _commit
from bench.spec_harness import _ints, harness_args, out_dir, quick_harness, save_report
from bench.spec_self_acceptance import draft_pass, reference_prompts, sampled_chunks, summarise, write_section
from engine.spec.layer_skip import kept_layers

CAVEAT = ("SmolLM2-135M (30 layers) at 1-8k tokens, measured on a CPU, is a weak proxy for PaCoRe-8B (36 layers) at "
          "~50k: read the ratio of layer-skip to full-depth drafts, not the levels.")
RULES = ("coupled", "rejection")
DEPTHS = (4, 6)  # the tokens-per-verify columns (num_speculative_tokens)


def variants(total: int, keep: list[float], spread: list[float]) -> dict[str, tuple[int, ...] | None]:
    """label -> the layers a draft runs: "N/N" every one, "n/N" the default choice of n (a middle block
    skipped), "n/N spread" n layers evenly spaced from the first to the last (rounded half up)."""
    out: dict[str, tuple[int, ...] | None] = {f"{total}/{total}": None}
    for f in keep:
        n = max(1, min(total, round(f * total)))
        out.setdefault(f"{n}/{total}", kept_layers(n, total))
    for f in spread:
        n = max(1, min(total, round(f * total)))
        if 1 < n < total:
            out[f"{n}/{total} spread"] = tuple((2 * i * (total - 1) + n - 1) // (2 * (n - 1)) for i in range(n))
    return out


def measure(args, save=lambda res: None) -> dict:
    """Per context bin and "window/sink", the acceptance of every variant's drafts; ``save(res)`` after each bin."""
    from engine import LLM, SamplingParams
    from pacore.cli.demo import DEMO_PROBLEMS

    messages = [{"role": "user", "content": DEMO_PROBLEMS[args.problem]["question"] + SUFFIX}]
    llm = LLM(args.model, max_model_len=args.max_model_len)
    total = llm.runner.cfg.num_layers
    kinds = variants(total, args.keep, args.spread)
    t0 = time.process_time()
    prompts = reference_prompts(llm, args, messages)
    log = lambda msg: print(f"[{time.process_time() - t0:6.0f} s CPU] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"prompts of {[len(p) for p in prompts]} tokens; drafts {list(kinds)}")
    res = {"layers": total, "kept": {k: v and list(v) for k, v in kinds.items()}, "bins": [],
           "temperature": args.temperature}
    for (lo, hi), prompt in zip(args.bins, prompts):
        params = SamplingParams(n=args.k, temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
        _, blocks, _, chunks = sampled_chunks(llm, args, prompt, params, args.depth)
        entry = {"context": [lo, hi], "prompt_tokens": len(prompt), "chunks": len(chunks.rows), "windows": {}}
        for window, sink in args.windows:
            by = entry["windows"][f"{window}/{sink}"] = {}
            for label, layers in kinds.items():
                llm.runner.draft_layers = layers  # what draft_layers gives an engine's runner
                a = draft_pass(llm, chunks, window, sink, args.depth, args.temperature, args.batch)
                by[label] = {rule: summarise(a[rule]) for rule in RULES}
            llm.runner.draft_layers = None
        blocks.release()
        log(f"context {lo}-{hi}: {len(chunks.rows)} draft starts, {len(kinds)} variants x {len(args.windows)} windows")
        res["bins"].append(entry)
        res["cpu_s"] = time.process_time() - t0
        save(res)
    return res


def section(res: dict, command: str) -> dict:
    """The profile's ``self_layerskip`` section: per temperature, rule and "kept/total", per bin and window, the
    layer-skip drafts' acceptance beside the full-depth ones' and tokens per verify [full depth, layer skip]."""
    total, profiles = res["layers"], {}
    full = f"{total}/{total}"
    for b in res["bins"]:
        for ws, by in b["windows"].items():
            for label, s in by.items():
                if label == full or " " in label:  # the full-depth baseline, the comparison-only spread
                    continue
                for rule in RULES:
                    f, ls = by[full][rule], s[rule]
                    tpv = {str(d): [f["tokens_per_verify"][d - 1], ls["tokens_per_verify"][d - 1]]
                           for d in DEPTHS if d <= len(f["tokens_per_verify"])}
                    profiles.setdefault(str(res["temperature"]), {}).setdefault(rule, {}).setdefault(label, []).append(
                        {"context": b["context"], "window": ws, "chunks": b["chunks"], "accept": ls["accept"],
                         "accept_full": f["accept"], "tokens_per_verify": tpv})
    return {"model": res.get("model") or "smollm2-135m", "note": CAVEAT, "command": command, "commit": _commit(),
            "layers": total, "kept": {k: v for k, v in res["kept"].items() if v and " " not in k},
            "profiles": profiles}


def _tpv(s: dict, full: dict | None, depth: int) -> str:
    """Tokens per verify at ``depth`` drafts (at most the measured depth), and its ratio to ``full``'s."""
    i = min(depth, len(s["tokens_per_verify"])) - 1
    t = s["tokens_per_verify"][i]
    return f"{t:.2f}" if full is None else f"{t:.2f} ({t / full['tokens_per_verify'][i]:.2f})"


def table(res: dict) -> str:
    full = f"{res['layers']}/{res['layers']}"
    lines = ["| context | window/sink | draft layers | coupled: accept 1st | tokens per verify at 4 drafts "
             "(ratio to full depth) | at 6 drafts | rejection: tokens per verify at 6 |", "|" + "---|" * 7]
    for b in res["bins"]:
        for ws, by in b["windows"].items():
            for label, s in by.items():
                ref = None if label == full else by[full]
                c, r = s["coupled"], s["rejection"]
                cells = [f"{c['accept'][0]:.2f}", _tpv(c, ref and ref["coupled"], 4), _tpv(c, ref and ref["coupled"], 6),
                         _tpv(r, ref and ref["rejection"], 6)]
                lines.append(f"| {b['context'][0]}-{b['context'][1]} | {ws} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spec_layerskip_acceptance", description=__doc__.split("\n")[0])
    harness_args(p, k=3, max_tokens=192)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--windows", type=lambda s: [tuple(_ints(w.replace("/", ","))) for w in s.split(";")],
                   default=[(512, 16)], help="WINDOW/SINK;... (default 512/16, the rehearsal's)")
    p.add_argument("--keep", type=lambda s: [float(x) for x in s.split(",")], default=[0.9, 0.75, 0.5],
                   help="fractions of the layers a layer-skip draft keeps")
    p.add_argument("--spread", type=lambda s: [float(x) for x in s.split(",") if x], default=[0.75],
                   help="fractions to measure also as layers spread evenly (comparison only)")
    p.add_argument("--out", default="runs/spec_layerskip_acceptance")
    p.add_argument("--profile-out", help=f"the profile JSON to put the self_layerskip section in (default: "
                   f"{DEFAULT_PROFILE}; with --quick: OUT/profile.json)")
    args = p.parse_args(argv)
    if args.quick:
        quick_harness(args)
        args.windows, args.keep, args.spread, args.stride = [(64, 16)], [0.5], [0.75], 2
    out = out_dir(args)
    command = " ".join(["python -m bench.spec_layerskip_acceptance", *sys.argv[1:]] if argv is None else
                       ["python -m bench.spec_layerskip_acceptance", *argv])
    profile = Path(args.profile_out or (out / "profile.json" if args.quick else DEFAULT_PROFILE))

    def save(res: dict) -> str:  # after every bin, the profile's section too
        res["model"] = args.model
        write_section(profile, section(res, command), "self_layerskip")
        return save_report(out, res, {"command": command, "note": CAVEAT}, CAVEAT, table(res))
    print(save(measure(args, save)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
