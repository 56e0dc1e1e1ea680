"""Exact verification: which of a row's draft tokens it keeps.

Each position of a verify row is sampled exactly as plain decoding would sample it: the same
distribution (penalties at that position's history, its drafts before it included; temperature,
min-p/top-k/top-p) and, for a seeded request, the same counter-based draw
(seed, trajectory, position). Drafts are kept while the target's own token equals them; the first
position where it differs emits the target's token and ends the run, and when all d drafts agree the
next position's token is emitted too. Every emitted token is therefore the token plain decoding would
draw at that position given the same prefix: the output is the trajectory without speculation (token
for token for greedy and seeded requests, in distribution for unseeded ones), and a draft is accepted
with exactly its probability under the target.

``rejection_runs`` is textbook speculative sampling for drafts drawn from a full distribution q (a
self-drafting step's): a draft d is kept with probability min(1, p(d) / q(d)), a rejected one replaced
by a draw from norm(max(0, p - q)), and a bonus drawn from p when all are kept. The output has the
target's distribution exactly, with different tokens than plain decoding would draw. A seeded
request's accept and residual draws come from streams of its own, keyed by position (engine/sample/rng.py),
so they do not depend on what else runs; the others' from the engine's generator.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.sample.penalties import outputs_before, penalize
from engine.sample.rng import ACCEPT, RESIDUAL, stream_key, uniform
from engine.core.step_plan import Run

if TYPE_CHECKING:
    from engine.sample.sampler import Sampler
    from engine.core.step_plan import StepPlan


def sample_runs(plan: StepPlan, logits, sampler: Sampler, drafted=None) -> list[Run]:
    """The step's tokens, a run per sampled sequence. ``drafted``: what self-drafting handed back (the
    noise keys its drafts were coupled to, or per row the distributions q they were drawn from)."""
    if plan.sample_seqs:
        logits = penalize(logits, plan.sample_seqs, outputs_before(plan.sample_seqs, plan.sample_offsets, plan.drafts))
    if isinstance(drafted, dict):
        return rejection_runs(plan, logits, drafted, sampler)
    tokens = sampler(logits, plan.sample_seqs, plan.sample_offsets, drafted) if plan.sample_seqs else []
    return accepted_runs(plan, tokens)


def accepted_runs(plan: StepPlan, tokens: list[int]) -> list[Run]:
    """One run per sampled sequence, from the tokens sampled at each of the plan's sample entries."""
    drafts = plan.drafts
    if not drafts:
        return [(seq, [t], i) for i, (seq, t) in enumerate(zip(plan.sample_seqs, tokens))]
    runs: list[Run] = []
    seqs, i = plan.sample_seqs, 0
    while i < len(tokens):
        draft = drafts.get(seqs[i].seq_id, ())
        runs.append((seqs[i], _kept(tokens, i, draft), i))
        i += len(draft) + 1
    return runs


def _kept(tokens: list[int], at: int, draft) -> list[int]:
    """The run of a row whose positions sampled tokens[at:at + len(draft) + 1]: each sampled token, while
    the one before it equalled its draft."""
    run = [tokens[at]]
    for j, d in enumerate(draft):
        if run[-1] != d:
            break
        run.append(tokens[at + j + 1])
    return run


def rejection_runs(plan: StepPlan, logits: torch.Tensor, q: dict[int, torch.Tensor], sampler: Sampler) -> list[Run]:
    """Runs for drafts drawn from full distributions (q: seq id -> [n, V], the distribution each of its n
    drafts was drawn from), all sampled rows at once. A greedy row keeps its drafts while the target's
    argmax agrees, and a row without drafts samples as plain decoding does: accepted_runs' rule."""
    entries, i, seqs = [], 0, plan.sample_seqs  # (seq, first entry, drafts) per sampled sequence
    while i < len(seqs):
        draft = plan.drafts.get(seqs[i].seq_id, []) if plan.drafts else []
        entries.append((seqs[i], i, draft))
        i += len(draft) + 1
    spec = [e for e in entries if e[2] and not e[0].params.greedy]
    plain = [e for e in entries if not e[2] or e[0].params.greedy]
    out: dict[int, list[int]] = {}  # first entry -> run
    if plain:  # greedy rows and rows without drafts: the coupled rule is theirs
        idx = [k for seq, first, draft in plain for k in range(first, first + len(draft) + 1)]
        sub = [(seq, off) for seq, _, draft in plain for off in range(len(draft) + 1)]
        tokens = sampler(logits[torch.tensor(idx, device=logits.device)], [s for s, _ in sub], [o for _, o in sub])
        at = 0
        for seq, first, draft in plain:
            out[first] = _kept(tokens, at, draft)
            at += len(draft) + 1
    if spec:
        out |= _speculative_sampling(spec, logits, q, sampler)
    return [(seq, out[first], first) for seq, first, _ in entries]


def _speculative_sampling(rows, logits: torch.Tensor, q: dict[int, torch.Tensor], sampler: Sampler) -> dict[int, list[int]]:
    """first entry -> run, for rows (seq, first entry, drafts) of sampled requests: draft j kept with
    probability min(1, p_j(d_j) / q_j(d_j)) while the ones before it were; the first rejected one replaced
    by a draw from norm(max(0, p_j - q_j)); a bonus drawn from p_n when all n are kept."""
    dev, gen = logits.device, sampler.generator
    R, N = len(rows), max(len(d) for _, _, d in rows)
    n = torch.tensor([len(d) for _, _, d in rows], device=dev)
    first = torch.tensor([f for _, f, _ in rows], device=dev)
    j = torch.arange(N + 1, device=dev)
    at = first[:, None] + torch.minimum(j[None, :], n[:, None])                 # [R, N + 1] entries
    params = [seq.params for seq, _, _ in rows for _ in range(N + 1)]
    p = sampler.normalised_probs(logits[at.reshape(-1)], params).reshape(R, N + 1, -1)
    qs = torch.zeros(R, N, p.shape[-1], device=dev)
    for r, (seq, _, d) in enumerate(rows):
        qs[r, :len(d)] = q[seq.seq_id].to(dev)
    drafts = torch.tensor([d + [0] * (N - len(d)) for _, _, d in rows], device=dev)
    p_d = p[:, :N].gather(2, drafts[..., None])[..., 0]
    q_d = qs.gather(2, drafts[..., None])[..., 0]
    u = torch.rand(R, N, dtype=torch.float64, generator=gen, device=sampler.device).to(dev)
    u = _seeded(u, rows, lambda seq, r: [stream_key(seq.stream, seq.num_generated + j, ACCEPT) for j in range(N)])
    keep = (u * q_d < p_d) & (j[None, :N] < n[:, None])
    m = keep.long().cumprod(1).sum(1)                                           # drafts kept
    rows_ = torch.arange(R, device=dev)
    last = p[rows_, m]                                                          # p at the first unkept position
    rejected = m < n
    residual = (last - qs[rows_, m.clamp(max=N - 1)]).clamp_min(0)
    residual = torch.where((residual.sum(-1, keepdim=True) > 0), residual, last)
    w = torch.where(rejected[:, None], residual, last).double().cumsum(-1)
    v = torch.rand(R, dtype=torch.float64, generator=gen, device=sampler.device).to(dev)
    kept = m.tolist()
    v = _seeded(v[:, None], rows, lambda seq, r: [stream_key(seq.stream, seq.num_generated + kept[r], RESIDUAL)])[:, 0]
    final = torch.searchsorted(w, (v * w[:, -1])[:, None], right=True)[:, 0].clamp_(max=w.shape[1] - 1)
    out = {}
    for (seq, f, d), k, t in zip(rows, kept, final.tolist()):
        out[f] = d[:k] + [t]
    return out


def _seeded(draws: torch.Tensor, rows, keys_of) -> torch.Tensor:
    """draws (float64 [R, k], uniforms from the engine's generator) with each seeded row's replaced by
    uniforms from its own stream (``keys_of(seq, r)``: row r's k keys)."""
    seeded = [r for r, (seq, _, _) in enumerate(rows) if seq.stream is not None]
    if seeded:
        own = [uniform(k) for r in seeded for k in keys_of(rows[r][0], r)]
        draws[torch.tensor(seeded, device=draws.device)] = torch.tensor(own, dtype=torch.float64).view(len(seeded), -1).to(draws.device)
    return draws
