"""Turn logits into tokens: greedy, temperature, top-k, top-p, min-p, per-sequence seeded streams."""
from __future__ import annotations

import torch

from engine.sequence import Sequence


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits fp32 [N, V], one row per sequence to sample."""
        params = [s.params for s in seqs]
        if all(p.greedy for p in params):
            return logits.argmax(dim=-1).tolist()
        n = len(seqs)
        temps = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        if any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params):
            probs = self._filter(probs, params)
        # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p, and lets each sequence
        # with a seed use its own stream while the others share one batched draw. E = -log(U):
        # torch's exponential_ is ~3x slower per element on CPU than rand + log.
        noise = torch.empty_like(probs)
        shared = [i for i, s in enumerate(seqs) if s.generator is None]
        if shared:
            noise[shared] = torch.rand(len(shared), probs.shape[1], device=probs.device,
                                       generator=self.generator).log_().neg_()
        for i, s in enumerate(seqs):
            if s.generator is not None:
                torch.rand(probs.shape[1], device=probs.device, generator=s.generator, out=noise[i])
                noise[i].log_().neg_()
        sampled = (probs / noise).argmax(dim=-1)
        greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        if greedy.any():
            sampled = torch.where(greedy, logits.argmax(dim=-1), sampled)
        assert sampled.shape[0] == n
        return sampled.tolist()

    @staticmethod
    def _filter(probs: torch.Tensor, params) -> torch.Tensor:
        dev = probs.device
        top_k = torch.tensor([p.top_k if p.top_k > 0 else probs.shape[1] for p in params], device=dev)
        top_p = torch.tensor([p.top_p for p in params], device=dev)
        min_p = torch.tensor([p.min_p for p in params], device=dev)
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        rank = torch.arange(probs.shape[1], device=dev)[None, :]
        # Keep a token if the mass strictly before it is below top_p (so the top token always stays).
        before = sorted_p.cumsum(dim=-1) - sorted_p
        keep = (rank < top_k[:, None]) & (before < top_p[:, None])
        keep &= sorted_p >= min_p[:, None] * sorted_p[:, :1]
        sorted_p = sorted_p * keep
        return torch.zeros_like(probs).scatter_(1, idx, sorted_p)
