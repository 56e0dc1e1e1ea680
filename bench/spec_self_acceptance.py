"""Self-drafting's acceptance on the embedded model (speculative_config method "self_window"), and the
``self_window`` section of the profile the rehearsal reads.

    python -m bench.spec_self_acceptance            # the default: ~20 min of CPU time on 1 thread
    python -m bench.spec_self_acceptance --quick    # seconds, small (tests/bench runs it on a tiny model)

Prompts shaped as PaCoRe's round 2 (pacore/budget.py fit_round_prompt): a demo problem and the texts of
round 1's trajectories as references (``--refs-k`` of them, sampled at T=1.0), as many as bring the
prompt a quarter into each context bin. From each prompt, K trajectories are sampled (seeded) at each
temperature without speculation. Then, teacher-forced on those trajectories, the engine's own draft
step (ModelRunner.run_draft: the same weights and paged cache, attention over a sink and a window) runs
at every ``--stride``-th position c: its d-th step sees the full pass's KV before c and the draft
steps' own KV from c on, exactly as a verify step's drafts do once the drafts before them were
accepted (an accepted draft is the trajectory's token). Against the full pass's distribution p at the
same position (temperature applied), a draft from q is accepted, given the token y the target drew:

- coupled (the engine's default; engine/spec/self_window.py): target and draft are each the argmax of
  log-probability + the same Gumbel noise (pacore_kernels/gumbel_sample.py, the key of the target's draw at
  that position), so P(accept | y) = 1 / sum_j max(p_j, q_j p_y / q_y);
- rejection (speculative sampling): P(accept | y) = min(1, q(y) / p(y));
- inverse_cdf, the coupling the engine had before its sampler drew by Gumbel-max (a what-if now): the
  draft is q's inverse CDF at the uniform u the target's own draw used, so P(accept | y) =
  |[P(<y), P(<=y)] & [Q(<y), Q(<=y)]| / p(y) (the CDFs in vocabulary order).

The trajectories are draws from p, so the mean over positions of the product of these conditionals
over draft steps 0..j is the chance that drafts 0..j are all accepted: no sampling noise of the
acceptance itself. From it: the acceptance per draft position (given the ones before it were) and the
tokens a verify step emits per num_speculative_tokens (1 + the sum of those chances). A real engine
run (self_window, policy "fixed", both rules) on the first bin checks the figures against its own
counters: its verify steps start where the previous one stopped, so they land more often in the
hard stretches than evenly spread positions do, a few points lower. A window covering the whole
context checks that the draft is then the model itself (max |q - p|).

A 135M model sampled at temperature 1.0 is far less predictable than an 8B reasoning model; its
contexts stop at 8k (PaCoRe-8B's round 1 runs to ~50k). Read these as the shape of the curves.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.spec_acceptance import DEFAULT_PROFILE, SUFFIX, _commit, write_report
from bench.spec_harness import _ints, harness_args, out_dir, quick_harness

CAVEAT = ("A 135M model sampled at temperature 1.0 is far less predictable than an 8B reasoning model, and its "
          "contexts stop at 8k: read these acceptances as the shape of the curves, not as PaCoRe-8B's figures.")
RULES = ("coupled", "rejection", "inverse_cdf")  # the last: a what-if (acceptance())
ENGINE_RULES = RULES[:2]


@dataclass(slots=True, eq=False)
class _Row:
    """What ModelRunner.prepare / run_draft read of a sequence: its tokens, KV blocks and buffer row."""

    token_ids: list[int]
    num_computed: int
    block_table: list[int]
    seq_id: int = 0
    row: int = -1


@dataclass(slots=True)
class Forced:
    """One trajectory teacher-forced through the full pass: its tokens (prompt first), its KV blocks,
    and the full pass's logits at positions ``first..`` (row i: the distribution of token first + i + 1)."""

    tokens: list[int]
    blocks: list[int]
    first: int
    logits: torch.Tensor


class Blocks:
    """KV blocks of the LLM's cache taken from its block manager (so the prefix cache evicts whatever
    they held) and given back without publishing their content: a draft step overwrites them."""

    def __init__(self, llm):
        self.bm, self.held = llm.block_manager, []

    def take(self, n: int) -> list[int]:
        out = [self.bm._new_block() for _ in range(n)]
        self.held += out
        return out

    def release(self) -> None:
        for b in self.held:
            self.bm._release(b, keep_cached=False)
        self.held = []


def _forward(runner, row: _Row, n: int, logits: bool) -> torch.Tensor | None:
    """Prefill ``n`` of row's tokens from num_computed on; the logits of every position when asked."""
    from engine.core.step_plan import StepPlan
    plan = StepPlan(prefills=[(row, n)], completes=[None if logits else False])
    out, _ = runner.execute(runner.prepare(plan))
    row.num_computed += n
    return out


def teacher_force(llm, blocks: Blocks, prompt: list[int], generations: list[list[int]], chunk: int) -> list[Forced]:
    """The full pass over the prompt (once: its full blocks are shared) and each prompt + generation."""
    runner, bs = llm.runner, llm.block_size
    shared = (len(prompt) // bs) * bs
    head = _Row(list(prompt), 0, blocks.take(shared // bs))
    while head.num_computed < shared:
        _forward(runner, head, min(chunk, shared - head.num_computed), logits=False)
    runner.release(head)
    out = []
    for gen in generations:
        tokens = list(prompt) + list(gen)
        row = _Row(tokens, shared, head.block_table + blocks.take(-(-len(tokens) // bs) - shared // bs))
        parts = []
        while row.num_computed < len(tokens):
            logits = _forward(runner, row, min(chunk, len(tokens) - row.num_computed), logits=True)
            parts.append(logits)
        runner.release(row)
        first = len(prompt)  # the first drafted position: a row's last token once its prompt is computed
        out.append(Forced(tokens, row.block_table, first, torch.cat(parts)[first - shared:]))
    return out


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float64 [N, V]: the distribution the engine's sampler draws from (fp32 softmax, float64 sums)."""
    p = torch.softmax(logits.float() / temperature, dim=-1).double()
    return p / p.sum(dim=-1, keepdim=True)


def acceptance(p: torch.Tensor, q: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per row, the chance a draft from q is accepted given the target drew y from p, under each rule
    (see the module docstring; coupled: both draws the argmax of log p + g and log q + g with one
    Gumbel noise g per token, P(both y) = 1 / sum_j max(p_j / p_y, q_j / q_y))."""
    P, Q = p.cumsum(-1), q.cumsum(-1)
    overlap = (torch.minimum(P, Q) - torch.maximum(P - p, Q - q)).clamp_min(0)  # uniforms drawing the same token
    py, qy = p.gather(1, y[:, None]), q.gather(1, y[:, None])
    both = torch.where(qy > 0, 1 / torch.maximum(p, q * py / qy.clamp_min(1e-300)).sum(-1, keepdim=True),
                       torch.zeros_like(py))
    return {"coupled": both[:, 0], "rejection": (qy / py).clamp(max=1.0)[:, 0],
            "inverse_cdf": overlap.gather(1, y[:, None])[:, 0] / py[:, 0]}


@dataclass(slots=True)
class Chunks:
    """Draft runs started at positions of teacher-forced trajectories, each with its own blocks for the
    positions it drafts (the part of the block before its start copied from the full pass)."""

    rows: list[_Row] = field(default_factory=list)
    forced: list[Forced] = field(default_factory=list)


def chunks_of(llm, blocks: Blocks, forced: list[Forced], depth: int, stride: int, limit: int | None = None) -> Chunks:
    bs, out, copies = llm.block_size, Chunks(), []
    for f in forced:
        for c in range(f.first, len(f.tokens) - depth, stride):
            own = blocks.take((c + depth - 1) // bs - c // bs + 1)
            out.rows.append(_Row(f.tokens, c, f.blocks[:c // bs] + own))
            out.forced.append(f)
            if c % bs:
                copies.append((f.blocks[c // bs], own[0]))
    llm.runner.copy_blocks(copies)
    if limit is not None and len(out.rows) > limit:  # evenly spread over the trajectories
        keep = [round(i * len(out.rows) / limit) for i in range(limit)]
        out.rows, out.forced = [out.rows[i] for i in keep], [out.forced[i] for i in keep]
    return out


def draft_pass(llm, chunks: Chunks, window: int, sink: int, depth: int, temperature: float,
               batch: int, selected: int = 0, before=None) -> dict[str, torch.Tensor]:
    """For every chunk and draft step d < depth: the acceptance chances (see ``acceptance``) [chunks, depth],
    and the largest |q - p| of each chunk's distributions (selected: sparse drafting, bench/spec_sparse_acceptance.py;
    ``before(rows)``, if given, runs before each batch's draft steps: its verify pass)."""
    runner = llm.runner
    res: dict[str, list] = {}
    for at in range(0, len(chunks.rows), batch):
        rows, forced = chunks.rows[at:at + batch], chunks.forced[at:at + batch]
        if before is not None:
            before(rows)
        cols: dict[str, list] = {}
        for d in range(depth):
            q_logits = runner.run_draft(rows, [r.token_ids[r.num_computed + d] for r in rows], d, window, sink,
                                       selected=selected)
            p = _probs(torch.stack([f.logits[r.num_computed + d - f.first] for r, f in zip(rows, forced)]), temperature)
            q = _probs(q_logits, temperature)
            y = torch.tensor([r.token_ids[r.num_computed + d + 1] for r in rows])
            for k, v in (acceptance(p, q, y) | {"max_abs_diff": (p - q).abs().amax(-1)}).items():
                cols.setdefault(k, []).append(v)
        for r in rows:
            runner.release(r)
        for k, v in cols.items():
            res.setdefault(k, []).append(torch.stack(v, 1))
    return {k: torch.cat(v) for k, v in res.items()}


def summarise(a: torch.Tensor) -> dict:
    """From per-chunk acceptance chances [chunks, depth]: P(drafts 0..j all accepted), the acceptance
    per position given the ones before it were, and tokens per verify step per num_speculative_tokens."""
    run = a.double().cumprod(1).mean(0)  # [j]: P(drafts 0..j accepted)
    prev = torch.cat([torch.ones(1, dtype=run.dtype), run[:-1]])
    accept = torch.where(prev > 0, run / prev.clamp_min(1e-300), torch.zeros_like(run))
    return {"accept": accept.tolist(), "run": run.tolist(),
            "tokens_per_verify": (1 + run.cumsum(0)).tolist()}


def reference_prompts(llm, args, messages: list[dict]) -> list[list[int]]:
    """Per context bin, a round-2-shaped prompt: the problem and as many of round 1's trajectories (as
    PaCoRe orders and passes them on) as bring it to a quarter into the bin, or all of them."""
    from engine import SamplingParams
    from pacore.budget import fit_round_prompt
    from pacore.compaction import Trajectory
    from pacore.prompts import order_responses
    tok, L = llm.tokenizer, llm.max_model_len
    p1 = fit_round_prompt(tok, messages, None, max_model_len=L, max_tokens=args.refs_tokens,
                          message_token_cap="auto").token_ids
    out = llm.generate([p1], SamplingParams(n=args.refs_k, temperature=1.0, max_tokens=args.refs_tokens,
                                            seed=args.seed), use_tqdm=False)[0]
    outs = sorted(out.outputs, key=lambda o: o.index)
    trajs = [Trajectory(o.index, o.text, o.finish_reason, len(o.token_ids)) for o in outs]
    refs = [t.message for t in order_responses(trajs, "official", 0) if t.passes_on]
    if args.bins is None:  # --quick: two bins split where the references' prompts reach, each measured
        fitted = [len(fit_round_prompt(tok, messages, refs[:m], max_model_len=L, max_tokens=args.max_tokens,
                                       message_token_cap="auto").token_ids) for m in range(1, len(refs) + 1)]
        mid = fitted[len(fitted) // 2]
        args.bins = [(fitted[0], mid), (mid, fitted[-1] + 1)]
    prompts = []
    for lo, hi in args.bins:
        target, ids = lo + (hi - lo) // 4, None
        for m in range(1, len(refs) + 1):
            ids = fit_round_prompt(tok, messages, refs[:m], max_model_len=L, max_tokens=args.max_tokens,
                                   message_token_cap="auto").token_ids
            if len(ids) >= target:
                break
        if not lo <= len(ids) < hi:  # a bin is labelled by the contexts it measured, never another's
            raise ValueError(f"context bin {lo}-{hi}: the prompt with round 1's {len(refs)} references is {len(ids)} "
                             f"tokens, outside the bin; raise --refs-k / --refs-tokens, or change --bins")
        prompts.append(ids)
    return prompts


def engine_check(model, prompt: list[int], params, spec: dict, plain: list[list[int]]) -> dict:
    """A real engine run with self-drafting (policy fixed): its counters, P(drafts 0..j accepted) from
    them, and how many trajectories equal plain decoding's."""
    from engine import LLM
    llm = LLM(model, max_model_len=len(prompt) + len(max(plain, key=len)) + 64, speculative_config=spec)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    got = [o.token_ids for o in sorted(out.outputs, key=lambda o: o.index)]
    st = llm.stats()
    drafts = max(1, st["spec_decode_num_drafts"])
    return {"config": spec, "counters": {k: v for k, v in st.items() if k.startswith("spec_decode_num")},
            "run": [n / drafts for n in st["spec_decode_num_accepted_tokens_per_pos"]],
            "tokens_per_verify": st["spec_decode_mean_tokens_per_verify"],
            "same_as_plain": sum(a == b for a, b in zip(got, plain)), "trajectories": len(plain)}


def sampled_chunks(llm, args, prompt: list[int], params, depth: int):
    """The trajectories of ``prompt`` that ``params`` samples, teacher-forced through the cache (their
    target logits) and cut into draft starts of ``depth``: (trajectories, blocks, forced, chunks)."""
    gens = [o.token_ids for o in sorted(llm.generate([prompt], params, use_tqdm=False)[0].outputs,
                                        key=lambda o: o.index)]
    blocks = Blocks(llm)
    forced = teacher_force(llm, blocks, prompt, gens, args.prefill_chunk)
    return gens, blocks, forced, chunks_of(llm, blocks, forced, depth, args.stride)


def measure(args) -> dict:
    from engine import LLM, SamplingParams
    from pacore.cli.demo import DEMO_PROBLEMS

    messages = [{"role": "user", "content": DEMO_PROBLEMS[args.problem]["question"] + SUFFIX}]
    llm = LLM(args.model, max_model_len=args.max_model_len)
    depth = args.depth
    t0 = time.process_time()
    prompts = reference_prompts(llm, args, messages)
    log = lambda msg: print(f"[{time.process_time() - t0:6.0f} s CPU] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"prompts of {[len(p) for p in prompts]} tokens")
    res = {"bins": [], "check": None}
    for (lo, hi), prompt in zip(args.bins, prompts):
        entry = {"context": [lo, hi], "prompt_tokens": len(prompt), "by_temperature": {}}
        for temp in args.temperatures:
            params = SamplingParams(n=args.k, temperature=temp, max_tokens=args.max_tokens, seed=args.seed)
            gens, blocks, forced, chunks = sampled_chunks(llm, args, prompt, params, depth)
            positions = [r.num_computed for r in chunks.rows]
            t = {"generated": sum(map(len, gens)), "chunks": len(chunks.rows),
                 "positions": [min(positions, default=0), max(positions, default=0)], "windows": {}}
            log(f"context {lo}-{hi} T={temp}: {t['generated']} tokens sampled, {len(chunks.rows)} draft starts")
            for window in args.windows:
                for sink in args.sinks:
                    a = draft_pass(llm, chunks, window, sink, depth, temp, args.batch)
                    t["windows"][f"{window}/{sink}"] = {
                        rule: summarise(a[rule]) for rule in RULES}
            log(f"  windows {args.windows} x sinks {args.sinks} done")
            if temp == args.temperatures[0]:  # the whole context in the window: the draft is the model itself
                few = chunks_of(llm, blocks, forced, depth, args.stride, limit=args.full_window_chunks)
                a = draft_pass(llm, few, args.max_model_len, 0, depth, temp, max(1, args.batch // 4))
                t["full_window"] = {"chunks": len(few.rows), "max_abs_diff": a["max_abs_diff"].max().item(),
                                    "accept_coupled": a["coupled"].mean().item()}
                log(f"  full window: max |q - p| = {t['full_window']['max_abs_diff']:.2e}")
            blocks.release()
            entry["by_temperature"][str(temp)] = t
            if res["check"] is None and args.check:
                w, s = args.check_window
                spec = {"method": "self_window", "num_speculative_tokens": depth, "window": w, "sink": s,
                        "policy": "fixed"}
                res["check"] = {"context": [lo, hi], "temperature": temp, "window": w, "sink": s,
                                "predicted": {rule: t["windows"][f"{w}/{s}"][rule] for rule in ENGINE_RULES}}
                for rule in ENGINE_RULES:
                    res["check"][rule] = engine_check(args.model, prompt, params, spec | {"acceptance": rule}, gens)
                log(f"  engine check done: {res['check']['coupled']['run']} vs predicted "
                    f"{res['check']['predicted']['coupled']['run']}")
        res["bins"].append(entry)
    res["cpu_s"] = time.process_time() - t0
    return res


def section(results: dict, args) -> dict:
    """The profile's ``self_window`` section: per temperature, rule and "window/sink", per context bin."""
    profiles: dict = {}
    for b in results["bins"]:
        for temp, t in b["by_temperature"].items():
            for ws, by_rule in t["windows"].items():
                for rule, s in by_rule.items():
                    profiles.setdefault(temp, {}).setdefault(rule, {}).setdefault(ws, []).append(
                        {"context": b["context"], "positions": t["positions"], "chunks": t["chunks"],
                         "accept": s["accept"], "tokens_per_verify": s["tokens_per_verify"]})
    diffs = [t["full_window"]["max_abs_diff"] for b in results["bins"] for t in b["by_temperature"].values()
             if "full_window" in t]
    return {"model": args.model or "smollm2-135m", "note": CAVEAT, "command": " ".join(
        ["python -m bench.spec_self_acceptance", *sys.argv[1:]]), "commit": _commit(), "k": args.k,
        "max_tokens": args.max_tokens, "stride": args.stride, "full_window_max_abs_diff": max(diffs, default=None),
        "profiles": profiles}


def write_section(path: Path, sec: dict, key: str = "self_window") -> None:
    """Put a section (self_window; self_layerskip: bench/spec_layerskip_acceptance.py) into the profile JSON,
    keeping what else it holds (the n-gram one, the other sections)."""
    raw = json.loads(path.read_text()) if path.is_file() else {}
    raw[key] = sec
    path.write_text(json.dumps(raw, indent=1) + "\n")


def tables(results: dict, args) -> str:
    nst = range(1, args.depth + 1)
    head = (f"| T | context | positions | rule | window/sink | accept by position | tokens / verify "
            f"(nst {' / '.join(map(str, nst))}) |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    for b in results["bins"]:
        for temp, t in b["by_temperature"].items():
            for rule in RULES:
                for ws, by_rule in t["windows"].items():
                    s = by_rule[rule]
                    lines.append(f"| {temp} | {b['context'][0]}-{b['context'][1]} | {t['positions'][0]}-"
                                 f"{t['positions'][1]} ({t['chunks']}) | {rule} | {ws} | "
                                 f"{' / '.join(f'{x:.2f}' for x in s['accept'])} | "
                                 f"{' / '.join(f'{x:.2f}' for x in s['tokens_per_verify'])} |")
    lines += ["", "| context | T | full-window chunks | max abs difference of probabilities | coupled acceptance |",
              "|---|---|---|---|---|"]
    for b in results["bins"]:
        for temp, t in b["by_temperature"].items():
            if "full_window" in t:
                f = t["full_window"]
                lines.append(f"| {b['context'][0]}-{b['context'][1]} | {temp} | {f['chunks']} | "
                             f"{f['max_abs_diff']:.1e} | {f['accept_coupled']:.4f} |")
    c = results.get("check")
    if c:
        lines += ["", f"Engine check (context {c['context'][0]}-{c['context'][1]}, T={c['temperature']}, window "
                  f"{c['window']}, sink {c['sink']}, policy fixed): P(drafts 0..j accepted)",
                  "", "| rule | engine run | predicted | tokens / verify engine vs predicted | drafts | same as plain |",
                  "|---|---|---|---|---|---|"]
        for rule in ENGINE_RULES:
            e, p = c[rule], c["predicted"][rule]
            lines.append(f"| {rule} | {' / '.join(f'{x:.2f}' for x in e['run'])} | "
                         f"{' / '.join(f'{x:.2f}' for x in p['run'])} | {e['tokens_per_verify']:.2f} vs "
                         f"{p['tokens_per_verify'][-1]:.2f} | {e['counters']['spec_decode_num_drafts']} | "
                         f"{e['same_as_plain']} of {e['trajectories']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spec_self_acceptance", description=__doc__.split("\n\n")[0])
    harness_args(p, k=4, max_tokens=256)
    p.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.6])
    p.add_argument("--windows", type=_ints, default=[128, 256, 512, 1024])
    p.add_argument("--sinks", type=_ints, default=[4, 16])
    p.add_argument("--full-window-chunks", type=int, default=32)
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="a real engine run with self-drafting on the first bin against the figures")
    p.add_argument("--check-window", type=lambda s: tuple(_ints(s)), default=(256, 16), metavar="W,S")
    p.add_argument("--out", default="runs/spec_self_acceptance")
    p.add_argument("--profile-out", help=f"the profile JSON to put the self_window section in (default: "
                   f"{DEFAULT_PROFILE}; with --quick: OUT/profile.json)")
    args = p.parse_args(argv)
    if args.quick:
        quick_harness(args)
        args.temperatures, args.windows, args.sinks, args.depth, args.stride = [1.0, 0.6], [16, 64, 512], [16], 4, 2
        args.full_window_chunks, args.check_window = 8, (64, 16)
    out = out_dir(args)
    results = measure(args)
    sec = section(results, args)
    profile_path = Path(args.profile_out or (out / "profile.json" if args.quick else DEFAULT_PROFILE))
    write_section(profile_path, sec)
    write_report(out, results | {"self_window": sec}, CAVEAT, tables(results, args), profile_path,
                 f"CPU time: {results['cpu_s']:.0f} s; ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
