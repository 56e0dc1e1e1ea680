"""A scripted stand-in for engine.LLM with exactly its add_request/step interface (pacore tests only).

Tokens are characters: a prompt of N characters is N tokens, a child emits one character per step.
A request that asks for logprobs gets made-up ones (``fake_logprobs``: a function of the character and
its position); a child resumed without its earlier logprobs gets them recomputed 1e-6 off, as a real
recompute rounds differently, so a test can tell recomputed logprobs from those given back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.sample.logprobs import TokenLogprobs
from engine.sample.sampling_params import SamplingParams
from engine.core.sequence import CompletionOutput, RequestMetrics, RequestOutput


class FakeTokenizer:
    chat_template = "fake"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert tokenize is False
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    targets: list[str]
    produced: list[int] = field(default_factory=list)
    arrival: float = 0.0
    first: float | None = None
    resumed_logprobs: list[TokenLogprobs | None] | None = None
    resumed_at: list[int] = field(default_factory=list)  # each child's tokens resumed with

    def logprobs(self, i: int, n: int) -> TokenLogprobs | None:
        """Child ``i``'s logprobs of its first ``n`` tokens: those it resumed with, then computed ones."""
        k = self.params.logprobs
        if k is None:
            return None
        given = self.resumed_logprobs[i] if self.resumed_logprobs else None
        if given is None:
            return fake_logprobs(self.targets[i][:n], k, recomputed=self.resumed_at[i] if self.resumed_at else 0)
        out = given[:n]
        out.extend(fake_logprobs(self.targets[i][len(given):n], k, start=len(given)))
        return out


def fake_logprobs(text: str, num_top: int, start: int = 0, recomputed: int = 0) -> TokenLogprobs:
    """Logprobs for the characters of ``text`` (at positions ``start``...): the chosen one's logprob and
    a descending top-``num_top`` that vary with the character and the position; the first ``recomputed``
    positions 1e-6 off."""
    codes = torch.tensor([ord(c) for c in text], dtype=torch.int64)
    pos = torch.arange(start, start + len(text))
    off = (pos < recomputed).double() * 1e-6
    chosen = (-((codes * 7 + pos * 3) % 13).double() / 8 - off).float()
    top = (-(torch.arange(num_top)[None, :] * 0.5 + ((codes + pos) % 5)[:, None] / 10).double() - off[:, None]).float()
    return TokenLogprobs.from_tensors({
        "num_top": torch.tensor(num_top), "token_ids": codes.int(), "logprobs": chosen,
        "ranks": ((codes + pos) % 3 + 1).int(), "top_ids": (torch.arange(num_top)[None, :] + codes[:, None]).int().flatten(),
        "top_logprobs": top.flatten()})


# script(prompt_text, params, request_id, child_index) -> the child's full text
Script = Callable[[str, SamplingParams, str, int], str]


class FakeLLM:
    """Continuous batching over scripted children: every active child advances one token per step."""

    def __init__(self, script: Script, max_model_len: int = 100_000, interrupt_at_step: int | None = None,
                 block_size: int = 16):
        self.script = script
        self.tokenizer = FakeTokenizer()
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.interrupt_at_step = interrupt_at_step
        self.calls: list[tuple[str, list[int], SamplingParams]] = []
        self.step_log: list[set[str]] = []  # request ids that decoded in each step
        self.resumed: dict[str, list[int]] = {}  # request id -> tokens each child resumed with
        self.resumed_logprobs: dict[str, list] = {}  # request id -> the logprobs each child resumed with
        self._active: dict[str, _Req] = {}
        self._counter = 0
        self._stats = {"prefill_tokens": 0, "decode_tokens": 0, "prefix_cache_hit_tokens": 0,
                       "kv_blocks_total": 1000, "kv_blocks_peak": 0, "kv_blocks_peak_saved": 0,
                       "preemptions": 0, "cascade_decode_steps": 0}

    def describe(self) -> str:
        return f"engine: fake, context {self.max_model_len:,} tokens"

    def add_request(self, prompt, params, request_id=None, resume=None, resume_logprobs=None):
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens + max_tokens {params.max_tokens} > max_model_len {self.max_model_len}")
        rid = request_id or f"req-{self._counter}"
        self._counter += 1
        assert rid not in self._active, f"duplicate request id {rid}"
        text = self.tokenizer.decode(ids)
        targets = [self.script(text, params, rid, i) for i in range(params.n)]
        self.calls.append((rid, ids, params))
        if resume is not None and params.logprobs is not None:  # the engine's: a finished child never runs again
            for i, (tokens, reason) in enumerate(resume):
                if reason is not None and tokens and (resume_logprobs is None or resume_logprobs[i] is None):
                    raise ValueError(f"resume[{i}] is finished, so its logprobs cannot be recomputed")
        if resume_logprobs is not None:  # the engine's checks (LLM.add_request)
            assert resume is not None and len(resume_logprobs) == params.n
            for lp, (tokens, _) in zip(resume_logprobs, resume):
                if lp is not None and (len(lp) != len(tokens) or lp.num_top != params.logprobs):
                    raise ValueError(f"resume_logprobs of {len(lp)} positions (top {lp.num_top}) for {len(tokens)} "
                                     f"tokens (top {params.logprobs})")
        produced = [0] * params.n
        if resume is not None:  # each child continues where the snapshot left it
            assert len(resume) == params.n
            for i, (tokens, _) in enumerate(resume):
                assert self.tokenizer.decode(tokens) == targets[i][:len(tokens)], "resumed tokens differ"
                produced[i] = len(tokens)
            self.resumed[rid] = [len(t) for t, _ in resume]
        if resume_logprobs is not None:
            self.resumed_logprobs[rid] = resume_logprobs
        self._active[rid] = _Req(rid, ids, params, targets, list(produced), time.perf_counter(),
                                 resumed_logprobs=resume_logprobs, resumed_at=produced)
        self._stats["prefill_tokens"] += len(ids)  # once per request, whatever n is
        return rid

    def partial_outputs(self, rid):
        req = self._active[rid]
        return [(self.tokenizer.encode(t[:n]), None if n < min(len(t), req.params.max_tokens) else "stop")
                for t, n in zip(req.targets, req.produced)]

    def partial_logprobs(self, rid):
        req = self._active[rid]
        return [req.logprobs(i, n) for i, n in enumerate(req.produced)]

    def has_unfinished(self):
        return bool(self._active)

    def step(self):
        if self.interrupt_at_step is not None and len(self.step_log) >= self.interrupt_at_step:
            raise KeyboardInterrupt
        now = time.perf_counter()
        self.step_log.append(set(self._active))
        finished = []
        for rid, req in list(self._active.items()):
            if req.first is None:
                req.first = now
            for i, t in enumerate(req.targets):
                if req.produced[i] < min(len(t), req.params.max_tokens):
                    req.produced[i] += 1
                    self._stats["decode_tokens"] += 1
            if all(p >= min(len(t), req.params.max_tokens) for p, t in zip(req.produced, req.targets)):
                del self._active[rid]
                outs = []
                for i, t in enumerate(req.targets):
                    text = t[: req.params.max_tokens]
                    reason = "length" if len(t) > req.params.max_tokens else "stop"
                    outs.append(CompletionOutput(i, text, self.tokenizer.encode(text), reason,
                                                 logprobs=req.logprobs(i, len(text))))
                shared = (len(req.prompt) // self.block_size) * (req.params.n - 1)
                self._stats["kv_blocks_peak_saved"] = max(self._stats["kv_blocks_peak_saved"], shared)
                metrics = RequestMetrics(req.arrival, req.first, time.perf_counter(), len(req.prompt),
                                         sum(len(o.token_ids) for o in outs), 0, shared)
                finished.append(RequestOutput(rid, None, req.prompt, outs, 0, metrics))
        return finished

    def stats(self):
        return dict(self._stats)
