"""Speculative decoding's acceptance on the embedded model, and the profile the rehearsal reads.

    python -m bench.spec_acceptance            # the default: a few minutes on 1 thread of this CPU
    python -m bench.spec_acceptance --quick    # seconds, small (tests/bench runs it on a tiny model)

PaCoRe's two kinds of round prompt, built by pacore itself (pacore/budget.py fit_round_prompt):
round 1, a demo problem (pacore/cli/demo.py, asked to reason step by step) forked K ways; round 2,
the problem plus 4 references, the texts of round 1's trajectories in the order PaCoRe passes them
on (``--k2`` siblings, as the "high" preset's second round). At each temperature each round is
generated once, seeded, without speculation and once with it (``--spec-nst`` tokens, siblings on):
the CPU wall-clock of both, and whether their tokens agree. Then the same trajectories are replayed
through the engine's real scheduler and speculator for every ``--num-speculative-tokens``, with
lookup_siblings on and off: the rehearsal's model runner in place of the model and a sampler that
returns each recorded token. Seeded speculation is exact (a trajectory is the same with it on or
off), so the replay meets the drafts and acceptances the real engine meets; the real speculative
run checks it (its counters equal the replay's).

Per temperature, round, num_speculative_tokens and siblings: how often a decode row has a draft,
draft tokens and accepted tokens per verify step, acceptance per draft position, tokens per row-step
(what a KV-bound decode gains in steps), and per corpus (the prompt, the row's own tokens, its
siblings) the share of drafts and their acceptance. The profile (``--profile-out``; by default
bench/rehearsal/spec_profile.json, which ``python -m bench.rehearsal --config spec-ngram`` reads via
engine/rehearsal/drafter.py) holds, with siblings on, per temperature, round kind and
num_speculative_tokens: the draft rate, the draft lengths and the per-position acceptance.

A 135M model sampled at temperature 1.0 is far less predictable than an 8B reasoning model: its
text wanders, so drafts are rarer and less often right than they would be for PaCoRe-8B, whose long
reasoning repeats its own and its references' expressions. Read these figures as a floor.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

CAVEAT = ("A 135M model sampled at temperature 1.0 is far less predictable than an 8B reasoning model: "
          "read these acceptances as a floor for PaCoRe-8B, not as its figures.")
SUFFIX = " Think step by step, then give the final answer."
DEFAULT_PROFILE = Path(__file__).parent / "rehearsal" / "spec_profile.json"
CORPORA = ("prompt", "own", "sibling")  # the n-gram drafter's (SpecStats.by_corpus has "model" too)


class Replay:
    """A sampler that returns each child's recorded tokens (entry i: ``offsets[i]`` past its next one)."""

    def __init__(self, trajectories: list[list[int]], eos: int):
        self.trajectories, self.eos = trajectories, eos

    def __call__(self, logits, seqs, offsets=None, keys=None):
        offsets = offsets or [0] * len(seqs)
        out = []
        for s, o in zip(seqs, offsets):
            t, g = self.trajectories[s.index], s.num_generated + o
            out.append(t[g] if g < len(t) else self.eos)
        return out


class _Counts:
    """Decode rows per step (an observer) and, per verified row, (draft length, accepted, kept)."""

    def __init__(self, llm):
        from engine.core.observers import StepObserver
        self.rows, self.verified = 0, Counter()
        counts = self

        class Rows(StepObserver):
            def step_planned(self, plan):
                counts.rows += len(plan.decodes)
        llm.add_observer(Rows())
        spec = llm.speculator
        count = spec.count

        def counted(seq, draft, matched, kept):
            counts.verified[(len(draft), min(matched, kept), kept)] += 1
            count(seq, draft, matched, kept)
        spec.count = counted


def summarise(counts: _Counts, stats: dict, by_corpus: dict, nst: int) -> dict:
    """The figures of one run (see the module docstring); ``accept[j]``: P(draft token j accepted |
    the tokens before it were)."""
    v = counts.verified
    drafts = sum(v.values())
    rows = max(1, counts.rows)
    per = lambda pred: sum(c for key, c in v.items() if pred(*key))  # noqa: E731
    accept = []
    for j in range(nst):
        reached = per(lambda d, a, k: d > j and a >= j)
        accept.append(per(lambda d, a, k: d > j and a > j) / reached if reached else 0.0)
    kept = sum(k * c for (d, a, k), c in v.items())  # tokens the verified rows emitted
    return {
        "rows": counts.rows, "drafts": drafts,
        "draft_rate": drafts / rows,
        "draft_len": [per(lambda d, a, k: d == i + 1) / drafts if drafts else 0.0 for i in range(nst)],
        "accept": accept,
        "draft_tokens_per_verify": stats["spec_decode_num_draft_tokens"] / max(1, drafts),
        "accepted_per_verify": stats["spec_decode_num_accepted_tokens"] / max(1, drafts),
        "tokens_per_verify": kept / max(1, drafts),
        "tokens_per_row_step": (counts.rows - drafts + kept) / rows,
        "by_corpus": {c: dict(zip(("drafts", "draft_tokens", "accepted"), n)) for c, n in by_corpus.items()},
        "counters": {k: stats[k] for k in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                                           "spec_decode_num_accepted_tokens")},
    }


def replay(model, prompt: list[int], trajectories: list[list[int]], params, spec: dict) -> dict:
    """Run the engine's scheduler and speculator over recorded trajectories (no model)."""
    from engine import LLM
    llm = LLM(model, device_model="h200", speculative_config=spec, num_kv_blocks=4096)
    llm.sampler = Replay(trajectories, llm.config.eos_token_ids[0])
    counts = _Counts(llm)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    got = [o.token_ids for o in sorted(out.outputs, key=lambda o: o.index)]
    if got != trajectories:
        raise RuntimeError("the replay did not reproduce the recorded trajectories (bench bug)")
    return summarise(counts, llm.stats(), llm.speculator.stats.by_corpus, spec["num_speculative_tokens"])


def generate(llm, prompt: list[int], params) -> dict:
    """One real generation: its trajectories, wall-clock, steps and model time (and the speculative
    counters it added, with speculation on)."""
    before = llm.stats()
    first = len(llm.step_log)
    t0, c0 = time.perf_counter(), time.process_time()
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    log = llm.step_log[first:]
    after = llm.stats()
    trajectories = [o.token_ids for o in sorted(out.outputs, key=lambda o: o.index)]
    res = {"trajectories": trajectories, "texts": [o.text for o in sorted(out.outputs, key=lambda o: o.index)],
           "finish": [o.finish_reason for o in sorted(out.outputs, key=lambda o: o.index)],
           "tokens": sum(map(len, trajectories)), "wall_s": wall, "cpu_s": cpu, "steps": len(log),
           "model_s": sum(r.model_s for r in log), "host_s": sum(r.schedule_s + r.sample_s for r in log)}
    if llm.speculator is not None:
        res["counters"] = {k: after[k] - before[k] for k in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                                                             "spec_decode_num_accepted_tokens")}
    return res


def round2_prompt(tokenizer, messages: list[dict], round1: dict, max_model_len: int, max_tokens: int) -> list[int]:
    """The problem plus 4 references from round 1, exactly as PaCoRe builds a later round's prompt."""
    from pacore.budget import fit_round_prompt
    from pacore.compaction import Trajectory
    from pacore.prompts import order_responses
    trajs = [Trajectory(i, text, fin, len(tok)) for i, (text, fin, tok)
             in enumerate(zip(round1["texts"], round1["finish"], round1["trajectories"]))]
    refs = [t.message for t in order_responses(trajs, "official", 0) if t.passes_on][:4]
    return fit_round_prompt(tokenizer, messages, refs, max_model_len=max_model_len, max_tokens=max_tokens,
                            message_token_cap="auto").token_ids


def measure(args) -> dict:
    """{"real": per "T/round", the runs without and with speculation; "replay": per
    "T/round/nst/siblings", summarise()'s figures}."""
    from engine import LLM, SamplingParams
    from pacore.budget import fit_round_prompt
    from pacore.cli.demo import DEMO_PROBLEMS

    problem = DEMO_PROBLEMS[args.problem]
    messages = [{"role": "user", "content": problem["question"] + SUFFIX}]
    opts = dict(record_steps=True)
    plain = LLM(args.model, **opts)
    spec_cfg = {"method": "ngram", "num_speculative_tokens": args.spec_nst}
    spec = LLM(args.model, speculative_config=spec_cfg, **opts)
    tok = plain.tokenizer
    prompt1 = fit_round_prompt(tok, messages, None, max_model_len=plain.max_model_len, max_tokens=args.max_tokens,
                               message_token_cap="auto").token_ids
    results = {"real": {}, "replay": {}}
    for temp in args.temperatures:
        for kind, k in (("round1", args.k), ("round2", args.k2)):
            prompt = prompt1 if kind == "round1" else round2_prompt(
                tok, messages, results["real"][f"{temp}/round1"]["plain"], plain.max_model_len, args.max_tokens)
            params = SamplingParams(n=k, temperature=temp, max_tokens=args.max_tokens, seed=args.seed)
            print(f"T={temp} {kind}: {len(prompt)} prompt tokens, K={k}: generating without and with speculation",
                  file=sys.stderr, flush=True)
            off, on = generate(plain, prompt, params), generate(spec, prompt, params)
            key = f"{temp}/{kind}"
            results["real"][key] = {"plain": off, "spec": on, "prompt_tokens": len(prompt),
                                    "same": sum(a == b for a, b in zip(off["trajectories"], on["trajectories"]))}
            for nst in args.num_speculative_tokens:
                for siblings in (True, False):
                    cfg = spec_cfg | {"num_speculative_tokens": nst, "lookup_siblings": siblings}
                    results["replay"][f"{key}/{nst}/{'siblings' if siblings else 'no-siblings'}"] = replay(
                        args.model, prompt, off["trajectories"], params, cfg)
            # the real speculative run against the replay of the same trajectories and config
            check = replay(args.model, prompt, on["trajectories"], params, spec_cfg)
            results["real"][key]["replay_counters_equal"] = check["counters"] == on["counters"]
    return results


def profile_of(results: dict, args) -> dict:
    """The rehearsal's profile: per temperature, round kind and num_speculative_tokens (siblings on)."""
    profiles: dict = {}
    for key, r in results["replay"].items():
        temp, kind, nst, sib = key.split("/")
        if sib == "siblings":
            profiles.setdefault(temp, {}).setdefault(kind, {})[nst] = {
                k: r[k] for k in ("draft_rate", "draft_len", "accept", "tokens_per_verify", "tokens_per_row_step",
                                  "rows", "drafts")}
    return {"model": args.model or "smollm2-135m", "note": CAVEAT, "command": " ".join(["python -m bench.spec_acceptance",
            *sys.argv[1:]]), "commit": _commit(), "k": args.k, "k2": args.k2, "max_tokens": args.max_tokens,
            "problem": args.problem, "profiles": profiles}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return ""


def tables(results: dict) -> str:
    head = ("| T | round | nst | siblings | rows | draft rate | draft tok/verify | accepted/verify | accept by position "
            "| tokens/verify | tokens/row-step | prompt: drafts, acc | own: drafts, acc | sibling: drafts, acc |")
    lines = [head, "|" + "---|" * 14]
    for key, r in results["replay"].items():
        temp, kind, nst, sib = key.split("/")
        corpus = []
        for c in CORPORA:
            b = r["by_corpus"][c]
            corpus.append(f"{100 * b['drafts'] / max(1, r['drafts']):.0f}%, "
                          f"{100 * b['accepted'] / max(1, b['draft_tokens']):.0f}%")
        lines.append(f"| {temp} | {kind} | {nst} | {'on' if sib == 'siblings' else 'off'} | {r['rows']} | "
                     f"{100 * r['draft_rate']:.0f}% | {r['draft_tokens_per_verify']:.2f} | {r['accepted_per_verify']:.2f} | "
                     f"{' / '.join(f'{a:.2f}' for a in r['accept'])} | {r['tokens_per_verify']:.2f} | "
                     f"{r['tokens_per_row_step']:.2f} | " + " | ".join(corpus) + " |")
    lines += ["", "| T | round | prompt tokens | tokens | same trajectories | steps off / on | wall s off / on "
              "| CPU s off / on | model s off / on | host s off / on | replay = real counters |", "|" + "---|" * 11]
    for key, r in results["real"].items():
        temp, kind = key.split("/")
        off, on = r["plain"], r["spec"]
        lines.append(f"| {temp} | {kind} | {r['prompt_tokens']} | {off['tokens']} / {on['tokens']} | "
                     f"{r['same']} of {len(off['trajectories'])} | {off['steps']} / {on['steps']} | "
                     f"{off['wall_s']:.2f} / {on['wall_s']:.2f} | {off['cpu_s']:.2f} / {on['cpu_s']:.2f} | "
                     f"{off['model_s']:.2f} / {on['model_s']:.2f} | "
                     f"{off['host_s']:.2f} / {on['host_s']:.2f} | {r['replay_counters_equal']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spec_acceptance", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--problem", type=int, default=0, help="index of the demo problem (pacore/cli/demo.py)")
    p.add_argument("--k", type=int, default=8, help="round 1's trajectories")
    p.add_argument("--k2", type=int, default=4, help="round 2's trajectories (the 'high' preset's K=4)")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.6])
    p.add_argument("--num-speculative-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 6])
    p.add_argument("--spec-nst", type=int, default=4, help="num_speculative_tokens of the real speculative run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a shared 2-core VM, 2 threads spin against each other)")
    p.add_argument("--out", default="runs/spec_acceptance")
    p.add_argument("--profile-out", help=f"the profile JSON (default: {DEFAULT_PROFILE}; with --quick: OUT/profile.json)")
    p.add_argument("--quick", action="store_true", help="K=2, 12 tokens, T=1.0, nst 2,4: the shapes in seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.k, args.k2, args.max_tokens, args.temperatures, args.num_speculative_tokens, args.spec_nst = (
            2, 2, 12, [1.0], [2, 4], 4)
    from bench.profile_run import apply_threads
    apply_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = measure(args)
    profile = profile_of(results, args)
    profile_path = Path(args.profile_out or (out / "profile.json" if args.quick else DEFAULT_PROFILE))
    if profile_path.is_file():  # the self-drafting benches' sections (self_window, self_sparse, ...) stay
        profile |= {k: v for k, v in json.loads(profile_path.read_text()).items() if k.startswith("self_")}
    profile_path.write_text(json.dumps(profile, indent=1) + "\n")
    write_report(out, results | {"profile": profile}, CAVEAT, tables(results), profile_path)
    return 0


def write_report(out: Path, report: dict, caveat: str, table: str, profile_path: Path, first: str = "") -> None:
    """OUT/report.json and OUT/table.md (the caveat above the table), printed with what was written."""
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "table.md").write_text(caveat + "\n\n" + table + "\n")
    print(caveat)
    print(table)
    print(f"{first}written: {profile_path}, {out / 'table.md'}, {out / 'report.json'}")


if __name__ == "__main__":
    sys.exit(main())
