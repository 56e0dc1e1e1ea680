"""LLM: the public engine. Requests in, a continuous-batching step loop, RequestOutputs out."""
from __future__ import annotations

import dataclasses
import itertools
import numbers
import time

import torch
from tqdm.auto import tqdm

from engine.attention import default_backend
from engine.block_manager import BlockManager, NoFreeBlocks
from engine.config import ModelConfig, resolve_dtype
from engine.default_model import resolve_model
from engine.kv_cache import bytes_per_block
from engine.metrics import StepRecord
from engine.model_runner import CascadePolicy, ModelRunner
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import CompletionOutput, Partial, Request, RequestOutput, Sequence, Status
from engine.stopping import StopChecker

_CPU_KV_BYTES = 2 << 30
_MAX_CPU_BLOCKS = 1 << 16


class StepError(RuntimeError):
    """A step failed. The requests it was running were aborted (blocks freed); ``partial`` holds
    each one's ``partial_outputs`` so that nothing computed is lost (resume them with
    ``add_request(..., resume=...)``). Other requests are untouched and the engine stays usable."""

    def __init__(self, partial: dict[str, list[Partial]], cause: Exception):
        self.partial = partial
        self.cause = cause
        super().__init__(f"engine step failed ({type(cause).__name__}: {cause}); aborted requests "
                         f"{sorted(partial)}")


class LLM:
    """Generate from a local Hugging Face folder (Llama, Qwen2, Qwen3) or the embedded default.

    model: a folder, or None / "smollm2-135m" for the embedded SmolLM2-135M-Instruct.
    num_kv_blocks / kv_cache_memory: size the paged cache by blocks or bytes (default: 90% of
    free GPU memory after weights on CUDA, 2 GiB on CPU).
    cascade_attention: True/False forces prefix-shared decode attention on/off; None decides per
    step and group: >= cascade_min_group sequences sharing >= cascade_min_prefix tokens, with
    group size * prefix length >= cascade_min_shared_tokens.
    enable_fork=False turns a request with n=K into K independent prompts (an ablation).
    enforce_eager=True skips CUDA graphs (on CUDA, decode steps replay captured graphs by default).
    batch_invariant=True: a token's logits, hence seeded draws, do not depend on the batch, chunking,
    fork, preemption or resume (fixed-shape torch ops, engine/model_runner.py; slower, no cascade/graphs).
    max_model_len / rope_scaling override the checkpoint's context and RoPE parameters (vLLM's
    ``--max-model-len`` / ``--rope-scaling``), e.g. rope_scaling={"rope_type": "yarn", "factor": 2.0,
    "original_max_position_embeddings": 32768}; keys not given keep the checkpoint's values.
    """

    def __init__(self, model: str | None = None, dtype: str | torch.dtype | None = None,
                 block_size: int = 16, num_kv_blocks: int | None = None,
                 kv_cache_memory: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, enable_fork: bool = True,
                 cascade_attention: bool | None = None, cascade_min_group: int = 2,
                 cascade_min_prefix: int = 64, cascade_min_shared_tokens: int = 1024,
                 attention_backend: str | None = None,
                 device: str | torch.device | None = None, seed: int = 0,
                 gpu_memory_utilization: float = 0.9, enforce_eager: bool = False,
                 record_steps: bool = False, rope_scaling: dict | None = None,
                 batch_invariant: bool = False):
        from transformers import AutoTokenizer
        if block_size < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        path = resolve_model(model)
        self.config = cfg = ModelConfig.from_pretrained(path, rope_scaling=rope_scaling)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(dtype, self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.max_model_len = max_model_len or cfg.max_position_embeddings
        self.block_size = block_size
        self.enable_fork = enable_fork
        self.runner = ModelRunner(
            cfg, self.dtype, self.device, block_size=block_size, max_num_seqs=max_num_seqs,
            max_model_len=self.max_model_len, backend=attention_backend or default_backend(self.device),
            cascade=CascadePolicy(cascade_attention, cascade_min_group, cascade_min_prefix,
                                  cascade_min_shared_tokens), batch_invariant=batch_invariant)
        per_block = bytes_per_block(cfg.num_layers, block_size, cfg.num_kv_heads, cfg.head_dim, self.dtype)
        num_blocks = num_kv_blocks or self._auto_blocks(per_block, kv_cache_memory, gpu_memory_utilization)
        self.runner.allocate_kv_cache(num_blocks, cuda_graphs=not enforce_eager)
        self.kv_bytes_per_block = per_block
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens,
                                   on_release=self.runner.release)
        self.sampler = Sampler(self.device, seed)
        self.stop_checker = StopChecker(self.tokenizer, cfg.eos_token_ids, self.max_model_len)
        self.requests: dict[str, Request] = {}
        self._outbox: list[RequestOutput] = []  # finished, not yet returned by step()
        self._ids = itertools.count()
        self._counters = dict(prefill_tokens=0, decode_tokens=0, steps=0)
        self.record_steps = record_steps
        self.step_log: list[StepRecord] = []  # filled when record_steps is on

    def _auto_blocks(self, per_block: int, kv_bytes: int | None, utilization: float) -> int:
        if kv_bytes is None and self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)  # weights are already loaded
            kv_bytes = int(free - total * (1 - utilization))
        if kv_bytes is None:
            return min(_MAX_CPU_BLOCKS, _CPU_KV_BYTES // per_block)
        blocks = int(kv_bytes // per_block)
        if blocks < 1:
            raise ValueError(f"kv_cache_memory={kv_bytes} bytes holds no {self.block_size}-token block "
                             f"({per_block} bytes each); give more memory or fewer tokens per block")
        return blocks

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, resume: list[Partial] | None = None) -> str:
        """Queue a prompt (text or token ids); returns its request id. Raises ValueError if it can
        never fit in max_model_len or the whole KV cache.

        resume: what ``partial_outputs`` returned for this request in an earlier session; each
        unfinished child continues after its tokens (a seeded child draws exactly what it would have).
        """
        params = params or SamplingParams()
        params.validate()
        text, ids = self._tokens(prompt)
        if params.max_tokens is None:  # fill the context, as vLLM does
            params = dataclasses.replace(params, max_tokens=max(1, self.max_model_len - len(ids)))
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len={self.max_model_len}; shorten the prompt, lower max_tokens "
                             "or raise max_model_len")
        bm = self.block_manager
        cache_tokens = bm.num_blocks * self.block_size
        if total > cache_tokens:
            raise ValueError(f"prompt ({len(ids)}) + max_tokens ({params.max_tokens}) needs more than the whole "
                             f"KV cache ({cache_tokens} tokens); lower max_tokens or max_model_len, or give the "
                             "cache more memory")
        if params.n > bm.num_blocks:
            raise ValueError(f"n={params.n} trajectories exceed the KV cache's {bm.num_blocks} blocks: each "
                             f"trajectory decodes into blocks of its own, so lower n or give the cache more memory")
        if request_id is None:
            request_id = next(i for i in map(str, self._ids) if i not in self.requests)
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        req = Request(request_id, text, ids, params)
        req.metrics.num_prompt_tokens = len(ids)
        if resume is not None:
            self._resume(req, resume)
            return request_id
        copies = 1 if self.enable_fork else params.n
        for i in range(copies):
            seq = Sequence(req, i, list(ids), len(ids), stream=req.stream(i),
                           fork_pending=self.enable_fork and params.n > 1)
            req.seqs.append(seq)
            self.scheduler.add(seq)
        self.requests[request_id] = req
        return request_id

    def _tokens(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"prompt is not valid Unicode text ({e.reason} at character {e.start}); "
                                 "remove lone surrogates or pass token ids") from None
            text, ids = prompt, self.tokenizer.encode(prompt)  # special tokens as vLLM adds them
        else:
            text = None
            if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
                raise ValueError("prompt must be a string or a list of integer token ids")
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        self._check_vocab("prompt", ids)
        return text, ids

    def _check_vocab(self, what: str, ids: list[int]) -> None:
        if any(t < 0 or t >= self.config.vocab_size for t in ids):
            raise ValueError(f"{what} has token ids outside the vocabulary [0, {self.config.vocab_size})")

    def _resume(self, req: Request, resume: list[Partial]) -> None:
        p = req.params
        if len(resume) != p.n:
            raise ValueError(f"resume has {len(resume)} children but the request has n={p.n}")
        for i, (tokens, reason) in enumerate(resume):
            if reason not in (None, "stop", "length"):
                raise ValueError(f"resume[{i}]: finish reason must be None, 'stop' or 'length', got {reason!r}")
            if len(tokens) > p.max_tokens or (reason is None and len(tokens) >= p.max_tokens):
                raise ValueError(f"resume[{i}] has {len(tokens)} tokens, beyond max_tokens={p.max_tokens}")
            self._check_vocab(f"resume[{i}]", tokens)
        if all(reason is not None for _, reason in resume):
            raise ValueError("resume: every child is already finished; there is nothing to run")
        for i, (tokens, reason) in enumerate(resume):
            # Like a preempted sequence: recomputed from the prefix cache, the prompt's blocks shared.
            seq = Sequence(req, i, req.prompt_token_ids + [int(t) for t in tokens], len(req.prompt_token_ids),
                           stream=req.stream(i))
            req.seqs.append(seq)
            if reason is None:
                self.scheduler.add(seq)
            else:
                seq.status, seq.finish_reason = Status.FINISHED, reason
        self.requests[req.request_id] = req

    def partial_outputs(self, request_id: str) -> list[Partial]:
        """Per child of a request in flight: (tokens generated so far, finish reason or None).

        A snapshot to continue from later with ``add_request(..., resume=...)``; children not forked
        yet have no tokens. KeyError for an id not in flight."""
        req = self.requests[str(request_id)]
        seqs = {s.index: s for s in req.seqs}
        return [(list(seqs[i].generated), seqs[i].finish_reason) if i in seqs else ([], None)
                for i in range(req.params.n)]

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def abort_request(self, request_id: str) -> None:
        """Drop a request in flight and free its KV blocks (unknown ids are ignored)."""
        req = self.requests.pop(str(request_id), None)
        for seq in req.seqs if req else []:
            self.scheduler.finish(seq)

    # -- the step loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; returns the requests that finished in it (or in a step that failed after
        they finished).

        If the step fails, the requests it was running are aborted, their KV blocks freed, and
        StepError reports them with their tokens so far; every other request carries on.
        """
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch:
            if self.scheduler.has_work():
                raise RuntimeError("scheduler made no progress with work queued (engine bug)")
            return self._take_outbox()
        t1 = time.perf_counter()
        cascade_before = self.runner.cascade_steps
        try:
            logits, sample_seqs = self.runner.run(batch)
            if self.record_steps and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t2 = time.perf_counter()
            self._advance(batch)
            self._sample_and_update(logits, sample_seqs)
        except Exception as e:
            raise self._fail_step(batch, e) from e
        done = self._take_outbox()
        if self.record_steps:
            bm = self.block_manager
            kind = "mixed" if batch.prefills and batch.decodes else ("decode" if batch.decodes else "prefill")
            self.step_log.append(StepRecord(
                self._counters["steps"], kind, len(batch.prefills), len(batch.decodes), batch.num_tokens,
                self.runner.cascade_steps > cascade_before, t1 - t0, t2 - t1, time.perf_counter() - t2,
                bm.num_used, bm.num_shared, bm.num_logical))
        return done

    def _take_outbox(self) -> list[RequestOutput]:
        done, self._outbox = self._outbox, []
        return done

    def _fail_step(self, batch: ScheduledBatch, error: Exception) -> StepError:
        # The step's KV writes may be half done: its requests cannot continue, and blocks they
        # filled must not be found by the prefix cache.
        ids = {seq.request.request_id for seq, _ in batch.prefills} | {s.request.request_id for s in batch.decodes}
        partial = {}
        for rid in sorted(ids):
            if rid in self.requests:
                partial[rid] = self.partial_outputs(rid)
                for seq in self.requests.pop(rid).seqs:
                    self.scheduler.finish(seq, keep_cached=False)
        return StepError(partial, error)

    def _advance(self, batch: ScheduledBatch) -> None:
        for seq, chunk in batch.prefills:
            seq.num_computed += chunk
            self._counters["prefill_tokens"] += chunk
        for seq in batch.decodes:
            seq.num_computed += 1
            self.block_manager.publish(seq, seq.num_computed)
        self._counters["decode_tokens"] += len(batch.decodes)
        self._counters["steps"] += 1

    def _sample_and_update(self, logits: torch.Tensor, sample_seqs: list[Sequence]) -> None:
        rows, owners = [], []
        for i, seq in enumerate(sample_seqs):
            group = self._fork(seq) if seq.fork_pending else [seq]
            rows.extend([i] * len(group))
            owners.extend(group)
        if not owners:
            return
        if len(rows) != len(sample_seqs):
            logits = logits[torch.tensor(rows, device=logits.device)]
        tokens = self.sampler(logits, owners)
        now = time.perf_counter()
        for seq, token in zip(owners, tokens):
            req = seq.request
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
            seq.token_ids.append(token)
            reason = self.stop_checker.check(seq)
            if reason is None:
                continue
            seq.finish_reason = reason
            self.scheduler.finish(seq)
            if req.is_finished:
                self._outbox.append(self._finish_request(req, now))

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """Prompt prefilled once: share its blocks with n-1 new sequences (copy a partial block).

        Returns the sequences to sample now; children with no slot or block wait and are
        recomputed from the prefix cache later, so sampling memory follows the batch, not n."""
        parent.fork_pending = False
        req = parent.request
        children = [Sequence(req, i, list(parent.token_ids), parent.num_prompt_tokens,
                             stream=req.stream(i))
                    for i in range(1, req.params.n)]
        req.seqs.extend(children)
        copies = []
        for child in children:
            try:
                if len(self.scheduler.running) >= self.scheduler.max_num_seqs:
                    self.scheduler.add(child)  # no slot now: recomputed later from the prefix cache
                    continue
                pair = self.block_manager.fork(parent, child)
            except NoFreeBlocks:
                self.scheduler.add(child)  # no block for its copy: likewise
                continue
            if pair:
                copies.append(pair)
            child.status = Status.RUNNING
            self.scheduler.running.append(child)
        self.runner.copy_blocks(copies)
        full = parent.num_computed // self.block_size
        running = [c for c in children if c.status is Status.RUNNING]
        req.metrics.kv_blocks_saved_by_sharing = full * len(running)
        req.shared_prefix_blocks = -1
        return [parent, *running]

    def _finish_request(self, req: Request, now: float) -> RequestOutput:
        del self.requests[req.request_id]
        req.metrics.finished_time = now
        req.metrics.num_generated_tokens = sum(s.num_generated for s in req.seqs)
        outputs = [CompletionOutput(s.index, self.stop_checker.final_text(s), s.generated, s.finish_reason)
                   for s in sorted(req.seqs, key=lambda s: s.index)]
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outputs,
                             req.metrics.num_cached_tokens, req.metrics)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run prompts (texts or token-id lists) to completion; outputs in prompt order.

        Requests added earlier with add_request keep running alongside; their outputs are returned
        by the next step(). If generate raises, the requests it added are aborted, no others."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], numbers.Integral)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} SamplingParams")
        ids: list[str] = []
        results: dict[str, RequestOutput] = {}
        others: list[RequestOutput] = []
        try:
            for p, sp in zip(prompts, params_list):
                ids.append(self.add_request(p, sp))
            pending = set(ids)
            total = sum(sp.n for sp in params_list)
            with tqdm(total=total, desc="trajectories", disable=not use_tqdm, dynamic_ncols=True) as bar:
                while pending:
                    if pending.isdisjoint(self.requests):
                        raise RuntimeError(f"requests {sorted(pending)} left the engine unfinished (engine bug)")
                    for out in self.step():
                        if out.request_id in pending:
                            pending.discard(out.request_id)
                            results[out.request_id] = out
                            bar.update(len(out.outputs))
                        else:
                            others.append(out)
        except BaseException:
            for rid in ids:
                self.abort_request(rid)
            raise
        finally:
            self._outbox[:0] = others  # someone else's requests: the next step() returns them
        return [results[i] for i in ids]

    def stats(self) -> dict:
        """Counters since start: tokens computed, prefix-cache hits, KV blocks, preemptions."""
        bm = self.block_manager
        return dict(
            prefill_tokens=self._counters["prefill_tokens"],
            decode_tokens=self._counters["decode_tokens"],
            steps=self._counters["steps"],
            prefix_cache_hit_tokens=self.scheduler.prefix_hit_tokens,
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=bm.num_used,
            kv_blocks_peak=bm.peak_used,
            kv_blocks_saved_by_sharing=bm.peak_saved,
            kv_bytes_per_block=self.kv_bytes_per_block,
            preemptions=self.scheduler.num_preemptions,
            cascade_decode_steps=self.runner.cascade_steps,
        )
