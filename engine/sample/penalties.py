"""Penalties and logit_bias: a transform of the logits before sampling (vLLM's meanings and order).

logit_bias is added first, and a request still short of its min_tokens has its stop tokens (EOS unless
ignore_eos, stop_token_ids) set to -inf (vLLM's min_tokens); then repetition_penalty divides the positive logits of the tokens seen in
the prompt or the generated tokens and multiplies the others; then frequency_penalty is subtracted once
per occurrence of a token in the generated tokens, presence_penalty once per token that occurs there.
Greedy requests see them too (their argmax is taken after them).

An entry's generated tokens are its sequence's plus, for a speculative query, the drafts before it
(``outputs_before``): the draft a query verifies was drawn under the same history, so every emitted
token is the one decoding without speculation draws (engine/spec/verify.py). Only the rows whose
request asks are touched, on the logits' own device, so the other rows are bit for bit unchanged.
"""
from __future__ import annotations

import array
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.core.sequence import Sequence


def stops_held_back(params, eos_token_ids: list[int]) -> tuple[int, ...]:
    """The tokens ``params.min_tokens`` keeps from being drawn early: its stop tokens, and the model's
    EOS unless ignore_eos (vLLM's MinTokensLogitsProcessor); none without min_tokens."""
    if not params.min_tokens:
        return ()
    return tuple(dict.fromkeys([*params.stop_token_ids, *([] if params.ignore_eos else eos_token_ids)]))


def outputs_before(seqs: list[Sequence], offsets: list[int] | None = None,
                   drafts: dict[int, list[int]] | None = None) -> list[list[int] | None]:
    """Per sample entry: the tokens generated before it (its sequence's, then the first ``offsets[i]``
    of the sequence's drafts), None where the request has no penalty."""
    offsets = offsets or [0] * len(seqs)
    return [None if not s.params.penalized else
            s.generated + (list(drafts[s.seq_id][:off]) if off else [])
            for s, off in zip(seqs, offsets)]


def penalize(logits: torch.Tensor, seqs: list[Sequence], outputs: list[list[int] | None]) -> torch.Tensor:
    """logits fp32 [N, V], entry i seqs[i]'s with ``outputs[i]`` generated before it: a copy with the
    penalised rows transformed, or ``logits`` itself when no row is (the common step costs nothing)."""
    rows = [i for i, out in enumerate(outputs) if out is not None]
    if not rows or logits.shape[-1] == 0:  # (a rehearsal's placeholder logits: nothing to change)
        return logits
    every = len(rows) == len(outputs)
    index = None if every else torch.tensor(rows, device=logits.device)
    sub = apply_penalties(logits if every else logits[index], [seqs[i].params for i in rows],  # (it copies)
                          [seqs[i].token_ids[:seqs[i].num_prompt_tokens] if seqs[i].params.repetition_penalty != 1
                           else [] for i in rows], [outputs[i] for i in rows],
                          [seqs[i].request.min_tokens_stops if len(outputs[i]) < seqs[i].params.min_tokens else ()
                           for i in rows])
    if every:
        return sub
    out = logits.clone()
    out[index] = sub
    return out


def apply_penalties(logits: torch.Tensor, params: list, prompts: list[list[int]],
                    outputs: list[list[int]], banned: list | None = None) -> torch.Tensor:
    """fp32 [R, V]: each row's logits with its params' logit_bias and penalties applied, given the
    row's prompt (read for a repetition penalty only) and generated tokens; ``banned``: per row, tokens
    set to -inf (min_tokens' stop tokens). ``logits`` is not changed.
    Only the entries of tokens in the histories change: a few passes over the rows, and work that
    follows the histories' length."""
    dev, (R, V) = logits.device, logits.shape
    logits = logits.clone()

    def flat(lists):  # each row's tokens as entries r * V + token of the [R, V] logits, on their device
        r = torch.arange(len(lists)).repeat_interleave(torch.tensor([len(x) for x in lists], dtype=torch.int64))
        ids = array.array("q")
        for x in lists:  # ~10x faster than torch.tensor of a long list: histories reach 10^5 tokens
            ids.fromlist(x)
        t = torch.frombuffer(ids, dtype=torch.int64) if ids else torch.empty(0, dtype=torch.int64)
        return (r * V + t).to(dev)

    def per_row(values):
        return torch.tensor(values, dtype=logits.dtype).to(dev)

    flat_logits = logits.view(-1)
    biased = [p.logit_bias or {} for p in params]
    if any(biased):
        flat_logits.index_add_(0, flat([list(b) for b in biased]), per_row([v for b in biased for v in b.values()]))
    if banned and any(banned):
        flat_logits[flat([[t for t in b if t < V] for b in banned])] = float("-inf")
    counts = torch.bincount(flat(outputs), minlength=R * V)  # (a sort, as torch.unique does, is far slower)
    generated = counts.nonzero()[:, 0]
    if any(p.repetition_penalty != 1 for p in params):
        seen = counts > 0
        seen[flat(prompts)] = True
        seen = seen.nonzero()[:, 0]
        rep, x = per_row([p.repetition_penalty for p in params])[seen // V], flat_logits[seen]
        flat_logits[seen] = torch.where(x > 0, x / rep, x * rep)
    rows = generated // V
    freq = per_row([p.frequency_penalty for p in params])[rows]
    presence = per_row([p.presence_penalty for p in params])[rows]
    flat_logits[generated] = flat_logits[generated] - freq * counts[generated].to(logits.dtype) - presence
    return logits
