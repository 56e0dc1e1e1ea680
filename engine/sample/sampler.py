"""Turn logits into tokens: greedy, temperature, min-p, top-k, top-p, per-sequence seeded draws; and
record the logprobs of the rows that ask (raw, or the distribution sampled from; engine/sample/logprobs.py).
Penalties and logit_bias are a transform of the logits before the sampler (engine/sample/penalties.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.sample.logprobs import LogprobRows, compute_logprobs, raw_logprobs
from engine.sample.penalties import penalize
from engine.sample.rng import stream_key
from pacore_kernels.gumbel_sample import gumbel_argmax_ref

try:
    from pacore_kernels.gumbel_sample import gumbel_argmax_triton
except ImportError:  # no triton: the torch draw only
    gumbel_argmax_triton = None

if TYPE_CHECKING:
    from engine.core.step_plan import StepPlan
    from engine.core.sequence import Sequence
    from engine.core.step_plan import Run

class Sampler:
    """Draws by Gumbel-max (pacore_kernels/gumbel_sample.py): a row's token is the argmax of its scores plus
    noise made from one 64-bit key, so a draw is a function of (logits, params, key) alone."""

    def __init__(self, device: torch.device, seed: int = 0, backend: str = "torch"):
        self.device = device
        self.generator = torch.Generator(device=device)  # unseeded requests share this stream
        self.generator.manual_seed(seed)
        if backend == "triton" and gumbel_argmax_triton is None:
            raise RuntimeError("the triton sampler needs triton; install it or use attention_backend='torch'")
        self._argmax = gumbel_argmax_triton if backend == "triton" else gumbel_argmax_ref

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], offsets: list[int] | None = None,
                 keys: torch.Tensor | None = None) -> list[int]:
        """logits fp32 [N, V] (penalties applied: engine/sample/penalties.py), one row per entry to sample:
        entry i draws sequence seqs[i]'s token at ``offsets[i]`` positions after its next one (a
        verified row's later queries; default 0), with the noise of ``keys[i]`` (default: ``keys(seqs,
        offsets)``). A seeded draw is the one plain decoding makes at that position."""
        params = [s.params for s in seqs]
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled:
            return logits.argmax(dim=-1).tolist()
        if keys is None:
            keys = self.keys(seqs, offsets)
        keys = keys.to(logits.device)
        if len(sampled) == len(params):
            return self._argmax(self.scores(logits, params), keys).tolist()
        # Only the rows that sample make noise; the greedy ones take their argmax.
        tokens = logits.argmax(dim=-1)
        rows = torch.tensor(sampled, device=logits.device)
        tokens[rows] = self._argmax(self.scores(logits[rows], [params[i] for i in sampled]), keys[rows])
        return tokens.tolist()

    def keys(self, seqs: list[Sequence], offsets: list[int] | None = None, purpose: int = 0) -> torch.Tensor:
        """int64 [N]: each entry's noise key: a seeded sequence's from its stream at its position
        (engine/sample/rng.py; ``purpose``: a derived stream's), the others' from the engine's generator. Drawn
        ahead, they let a self-drafting step draw its draft with the noise the target's own draw will
        use (engine/spec/self_window.py)."""
        keys = self.random_keys(len(seqs))
        offsets = offsets or [0] * len(seqs)
        seeded = [(i, stream_key(s.stream, s.num_generated + off, purpose))
                  for i, (s, off) in enumerate(zip(seqs, offsets)) if s.stream is not None]
        if seeded:
            rows, draws = zip(*seeded)
            keys[list(rows)] = torch.tensor(draws, dtype=torch.int64, device=self.device)
        return keys

    def random_keys(self, n: int) -> torch.Tensor:
        """int64 [n] keys from the engine's generator (noise no other draw shares)."""
        return torch.randint(-2 ** 63, 2 ** 63 - 1, (n,), dtype=torch.int64, device=self.device,
                             generator=self.generator)

    @classmethod
    def scores(cls, logits: torch.Tensor, params: list) -> torch.Tensor:
        """fp32 [N, V]: logits / temperature, the entries a filter (top-k, top-p, min-p) drops -inf; a
        row's values depend on its own logits and params only (every op is per row), not on the other
        rows. Their Gumbel argmax is a draw from normalised_probs."""
        temps = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
        scores = logits / temps[:, None]
        filtered = [i for i, p in enumerate(params) if p.top_k > 0 or p.top_p < 1 or p.min_p > 0]
        if filtered:
            rows = torch.tensor(filtered, device=logits.device)
            dropped = cls.probs(logits[rows], [params[i] for i in filtered], temps[rows]) == 0
            scores[rows] = scores[rows].masked_fill(dropped, float("-inf"))
        return scores

    @classmethod
    def normalised_probs(cls, logits: torch.Tensor, params: list) -> torch.Tensor:
        """fp32 [N, V]: the distribution each row is sampled from (temperature and filters, renormalised;
        a greedy row's at temperature 1)."""
        p = cls.probs(logits, params)
        return p / p.sum(dim=-1, keepdim=True)

    @classmethod
    def processed_logprobs(cls, logits: torch.Tensor, params: list) -> torch.Tensor:
        """fp32 [N, V]: the log of the distribution each row is sampled from (``logprobs_mode=
        processed_logprobs``): temperature and filters applied, renormalised, filtered tokens -inf. A
        greedy row takes temperature 1 (its draw is the argmax of that distribution)."""
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=logits.device)
        lp = torch.log_softmax(logits / temps[:, None], dim=-1)
        kept = cls.probs(logits, params, temps) > 0
        lp = lp.masked_fill(~kept, float("-inf"))
        return lp - lp.logsumexp(dim=-1, keepdim=True)

    @classmethod
    def probs(cls, logits: torch.Tensor, params: list, temps: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 [N, V]: each row's probabilities after temperature and filters (unnormalised once
        filtered); per row, as scores."""
        if temps is None:
            temps = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        filtered = [i for i, p in enumerate(params) if p.top_k > 0 or p.top_p < 1 or p.min_p > 0]
        # Only the rows that ask for it: an unfiltered row passed through _filter could lose its
        # tail (the float32 mass before it reaching 1), so it would depend on its batch-mates.
        if len(filtered) == len(params):
            probs = cls._filter(probs, params)
        elif filtered:
            rows = torch.tensor(filtered, device=logits.device)
            probs[rows] = cls._filter(probs[rows], [params[i] for i in filtered])
        return probs

    @staticmethod
    def _filter(probs: torch.Tensor, params) -> torch.Tensor:
        # vLLM's and transformers' order: min-p and top-k first, then top-p over what they kept,
        # renormalised (top-p over the whole distribution would keep more tokens).
        dev = probs.device
        vocab = probs.shape[1]
        top_k = torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], device=dev)
        top_p = torch.tensor([p.top_p for p in params], device=dev)
        min_p = torch.tensor([p.min_p for p in params], device=dev)
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        rank = torch.arange(probs.shape[1], device=dev)[None, :]
        # Top-k keeps every token at least as likely as the k-th, so tokens tied with it all stay (vLLM's
        # rule: logits [3, 2, 2, 2, 1, 0] with top_k 2 keep four).
        kth = sorted_p.gather(1, top_k[:, None] - 1)
        keep = (sorted_p >= kth) & (sorted_p >= min_p[:, None] * sorted_p[:, :1])
        kept = sorted_p * keep
        kept = kept / kept.sum(dim=-1, keepdim=True)
        # Keep a token if the kept mass strictly before it is below top_p. The top token always stays
        # (a top_p below float32's smallest subnormal, ~7e-46, is 0 here, and 0 < 0 would keep
        # nothing), and top_p = 1 keeps every token however the float32 sum rounds.
        before = kept.cumsum(dim=-1) - kept
        keep &= (before < top_p[:, None]) | (rank == 0) | (top_p[:, None] >= 1)
        sorted_p = sorted_p * keep
        return torch.zeros_like(probs).scatter_(1, idx, sorted_p)


def distribution(logits: torch.Tensor, params: list | None = None) -> torch.Tensor:
    """fp32 [M, V] log-probabilities: raw per row, except the rows given SamplingParams (processed
    mode), which get the distribution they are sampled from (Sampler.processed_logprobs)."""
    rows = [] if params is None else [i for i, p in enumerate(params) if p is not None]
    if rows and len(rows) == len(params):
        return Sampler.processed_logprobs(logits, params)
    lp = raw_logprobs(logits)
    if rows:  # prompt rows (raw) beside processed ones
        lp[rows] = Sampler.processed_logprobs(logits[rows], [params[i] for i in rows])
    return lp


def record_logprobs(plan: StepPlan, logits: torch.Tensor | None, runs: list[Run], scored: LogprobRows | None,
                    processed: bool) -> None:
    """Append one step's logprobs where they belong: the scored positions first (the request's prompt
    logprobs, or a resumed trajectory's own), in position order, then each appended token's (the runs,
    already cut at a stop: engine/spec/verify.py), computed for the rows that asked only, each from the
    distribution at its own position. ``processed``: logprobs_mode is processed_logprobs."""
    if scored is not None:
        at = 0
        for span in plan.scored:
            req = span.seq.request
            store = req.prompt_logprobs if span.prompt else span.seq.logprobs
            for i in range(at, at + span.count):
                store.append_row(scored, i)
            at += span.count
    asking = [(seq, first + j, t, seq.num_generated - len(run) + j)  # the run is appended: its tokens' places
              for seq, run, first in runs if seq.logprobs is not None for j, t in enumerate(run)]
    if not asking:
        return  # the common step: no log-softmax, no transfer
    seqs, entries, tokens, places = zip(*asking)
    rows = logits[torch.tensor(entries, device=logits.device)] if len(entries) < logits.shape[0] else logits
    if processed:  # the distribution sampled from: after the penalties, at each token's own history
        rows = penalize(rows, list(seqs), [s.generated[:at] if s.params.penalized else None
                                           for s, at in zip(seqs, places)])
    lp = distribution(rows, [s.params for s in seqs] if processed else None)
    computed = compute_logprobs(lp, torch.tensor(tokens), max(s.params.logprobs for s in seqs))
    for j, seq in enumerate(seqs):
        seq.logprobs.append_row(computed, j)
