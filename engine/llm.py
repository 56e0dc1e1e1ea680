"""LLM: the public engine. Requests in, a continuous-batching step loop, RequestOutputs out.

A step is glue between its parts: the Scheduler plans it (and owns every sequence's life, with the
Speculator's drafts when speculative decoding is on, engine/spec/), the ModelRunner turns the plan into
tensors and runs the model (on every tensor-parallel rank; self-drafting's draft steps first), the
Sampler picks the tokens and verification keeps the drafts they agree with (engine/spec/verify.py),
the Scheduler's postprocess appends them and finishes what stopped, the logprobs of the rows that
ask are recorded, and the StepHooks (engine/core/observers.py) time it for the observers. What add_request
refuses is in engine/core/checks.py; a Request assembles its own outputs (engine/core/sequence.py); a step that
fails (it raised, or a request's logits are not finite) hands its requests back in a StepError and
keeps every other one running (engine/core/step_errors.py). The file is past 300 lines because it is the
whole public API, each method with its docstring.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import numbers
import threading
import time
import weakref

import torch
from tqdm.auto import tqdm

from engine.worker.attention import default_backend
from engine.core.block_manager import BlockManager, salt_root
from engine.core.checks import (check_fits, check_logprobs, check_max_logprobs, check_resume, check_resume_logprobs,
                           check_stop_token_ids, prompt_ids)
from engine.config import EngineConfig, ModelConfig, resolve_dtype
from engine.context_length import check_max_model_len
from engine.default_model import resolve_model
from engine.core.fairness import FairShare
from engine.worker.kv_cache import kv_dtype_name
from engine.worker.loader import load_tokenizer
from engine.sample.logprobs import TokenLogprobs, prompt_logprobs_list
from engine.sample.penalties import stops_held_back
from engine.core.observers import StepHooks, StepObserver, StepRecord
from engine.sample.sampler import Sampler, record_logprobs
from engine.sample.sampling_params import SamplingParams
from engine.core.cascade import CascadePolicy
from engine.core.scheduler import Scheduler
from engine.core.step_plan import StepPlan
from engine.core.sequence import Partial, Request, RequestMetrics, RequestOutput
from engine.spec.config import SpeculativeConfig
from engine.spec.layer_skip import kept_layers
from engine.spec.policy import adaptive_policy
from engine.spec.speculator import Speculator
from engine.spec.verify import sample_runs
from engine.core.step_errors import StepError  # noqa: F401 (engine.llm.StepError, as before the move)
from engine.core.step_errors import abort_set_aside, fail_step, set_aside_non_finite
from engine.core.stopping import StopChecker
from engine.worker.tp_workers import start_ranks

log = logging.getLogger("engine")


class LLM:
    """Generate from a local Hugging Face folder (Llama, Qwen2, Qwen3) or the embedded default.

    model: a folder, or None / "smollm2-135m" for the embedded SmolLM2-135M-Instruct.
    options: the fields of EngineConfig (engine/config.py), which documents each one, e.g.
    max_model_len, rope_scaling, num_kv_blocks, max_num_seqs, cascade_attention, batch_invariant,
    tokenizer / skip_tokenizer_init.

    Threads: ``generate`` may be called from several threads at once; the calls are serialized (one
    runs, the others wait for it). The step API (``add_request``, ``step``, ``abort_request``,
    ``new_tokens``, ...) is not thread-safe: drive it from one thread, and not while another thread
    is in ``generate`` (the server's engine thread, engine/serve/engine_loop.py, owns its LLM so).
    """

    def __init__(self, model: str | None = None, **options):
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(EngineConfig)})
        if unknown:
            raise TypeError(f"unknown LLM option(s) {unknown}; the options are the fields of EngineConfig: "
                            f"{[f.name for f in dataclasses.fields(EngineConfig) if f.name != 'model']}")
        self.options = opts = EngineConfig(model=model, **options)
        path = resolve_model(model)
        self.config = cfg = ModelConfig.from_pretrained(path, rope_scaling=opts.rope_scaling,
                                                        quantization=opts.quantization)
        check_max_logprobs(opts.max_logprobs, cfg.vocab_size)
        self.device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        # A rehearsal models a GPU, so its dtype is a GPU's default.
        self.dtype = resolve_dtype(opts.dtype, torch.device("cuda") if opts.device_model else self.device)
        self.tokenizer = None if opts.skip_tokenizer_init else load_tokenizer(opts.tokenizer or path)
        self.max_model_len = check_max_model_len(cfg, opts.max_model_len)
        self.block_size = opts.block_size
        spec = SpeculativeConfig.from_dict(opts.speculative_config)
        cascade = CascadePolicy(False if opts.batch_invariant else opts.cascade_attention, opts.cascade_min_group,
                                opts.cascade_min_prefix, opts.cascade_min_shared_tokens,
                                opts.cascade_min_saved_fraction, opts.cascade_scope)
        runner_kwargs = dict(
            cfg=cfg, dtype=self.dtype, block_size=opts.block_size, max_num_seqs=opts.max_num_seqs,
            max_model_len=self.max_model_len, backend=opts.attention_backend or default_backend(self.device),
            cascade=cascade.enabled is not False, batch_invariant=opts.batch_invariant,
            kv_cache_dtype=opts.kv_cache_dtype, logprobs_mode=opts.logprobs_mode,
            verify_queries=spec.num_speculative_tokens + 1 if spec else 1,
            draft_steps=spec is not None and spec.method == "self_window",
            draft_select=(spec.sink, spec.selected, spec.window) if spec and spec.method == "self_window"
            and spec.selected else None, draft_selection=spec.selection if spec else "bounds",
            draft_layers=kept_layers(spec.draft_layers, cfg.num_layers) if spec and spec.method == "self_window"
            else None)
        if opts.device_model:
            from engine.device_model import DeviceParams
            from engine.rehearsal.runner import RehearsalRunner
            self.runner = RehearsalRunner(**runner_kwargs, device=DeviceParams.named(opts.device_model),
                                          speculative=spec)
        else:
            self.runner = start_ranks(runner_kwargs, opts.tensor_parallel_size, self.device)
        self.clock = getattr(self.runner, "clock", time.perf_counter)  # a rehearsal's is virtual
        weakref.finalize(self, self.runner.shutdown)  # stops TP workers; the registry keeps it, no handle needed
        try:
            # kv_bytes_per_block counts every rank's share of a block: the memory one block costs.
            self.kv_bytes_per_block = self.runner.kv_bytes_per_block * opts.tensor_parallel_size
            num_blocks = opts.num_kv_blocks or self.runner.auto_num_blocks(opts.kv_cache_memory,
                                                                           opts.gpu_memory_utilization)
            self.runner.allocate_kv_cache(num_blocks, cuda_graphs=not opts.enforce_eager)
        except BaseException:
            self.shutdown()
            raise
        self.kv_cache_dtype = kv_dtype_name(self.runner.kv_dtype)
        self.block_manager = BlockManager(num_blocks, opts.block_size, opts.enable_prefix_caching)
        log.info("%s", self.describe())
        self.stop_checker = StopChecker(self.tokenizer, cfg.eos_token_ids, self.max_model_len)
        self.speculator = None if spec is None else Speculator(  # a rehearsal's policy prices its own device
            spec, self.block_manager, self.max_model_len, adaptive_policy(
                spec, cfg, self.dtype, self.runner.kv_dtype, self.runner.device_params if opts.device_model else None,
                opts.block_size))
        self.scheduler = Scheduler(self.block_manager, self.stop_checker, opts.max_num_seqs,
                                   opts.max_num_batched_tokens, cascade, enable_fork=opts.enable_fork,
                                   on_release=self.runner.release, speculator=self.speculator,
                                   on_trim=self.runner.trimmed, fair=FairShare.resolve(
                                       opts.max_num_seqs, opts.max_num_batched_tokens,
                                       opts.long_prefill_token_threshold, opts.max_num_seqs_per_request))
        if opts.device_model:
            from engine.rehearsal.runner import ScriptedSampler
            self.sampler = ScriptedSampler(self.tokenizer, cfg.eos_token_ids[0] if cfg.eos_token_ids else 0)
            self.runner.bind(self.scheduler, self.block_manager)
        else:
            self.sampler = Sampler(self.device, opts.seed, runner_kwargs["backend"])
        self.processed_logprobs = opts.logprobs_mode == "processed_logprobs"
        tok = self.tokenizer
        self._decode_token = (lambda t: tok.decode([t])) if tok is not None else None  # Logprob.decoded_token
        self.requests: dict[str, Request] = {}
        self._outbox: list[RequestOutput] = []  # finished, not yet returned by step()
        self._ids = itertools.count()
        self._steps = 0
        self._cascade_steps = 0
        self._generate_lock = threading.RLock()  # generate() from several threads: one at a time
        self.hooks = StepHooks(opts.record_steps, self.device, self.runner.mark_ranges)

    @property
    def observers(self) -> list[StepObserver]:
        """The attached StepObservers (add_observer / remove_observer change it)."""
        return self.hooks.observers

    @property
    def step_log(self) -> list[StepRecord]:
        """One StepRecord per step, kept when the LLM was made with record_steps=True."""
        return self.hooks.log

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes and release the model, KV cache and CUDA graphs at
        once (idempotent; also done when the LLM is collected). The LLM runs no more requests after it."""
        self.runner.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, resume: list[Partial] | None = None,
                    resume_logprobs: list[TokenLogprobs | None] | None = None, cache_salt: str | None = None) -> str:
        """Queue a prompt (text or token ids); returns its request id. Raises ValueError if it can
        never fit in max_model_len or the whole KV cache.

        cache_salt: the prefix cache shares this request's blocks only with requests of the same salt
        (vLLM's: a client cannot learn from timing which prompts others sent).

        resume: what ``partial_outputs`` returned for this request in an earlier session; each
        unfinished child continues after its tokens (a seeded child draws exactly what it would have).
        resume_logprobs: what ``partial_logprobs`` returned then, per child (or None for a child):
        its earlier logprobs as they were. A child of a request with logprobs that has none given gets
        them recomputed from its tokens while its resume is prefilled (equal to float rounding).
        """
        self.runner.check_alive()  # a dead rank: say so now, not at the next step
        params = params or SamplingParams()
        params.validate()
        check_logprobs(params, self.options.max_logprobs, self.config.vocab_size,
                       rehearsal=bool(self.options.device_model))
        check_stop_token_ids(params, self.config.vocab_size)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer: use stop_token_ids, or load one (tokenizer=...)")
        text, ids = prompt_ids(prompt, self.tokenizer, self.config.vocab_size)
        if params.max_tokens is None:  # fill the context, as vLLM does
            params = dataclasses.replace(params, max_tokens=max(1, self.max_model_len - len(ids)))
        check_fits(len(ids), params, self.max_model_len, self.block_manager.num_blocks, self.block_size)
        if request_id is None:
            request_id = next(i for i in map(str, self._ids) if i not in self.requests)
        request_id = str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"cache_salt must be a non-empty string or None, got {cache_salt!r}")
        req = Request(request_id, text, ids, params, metrics=RequestMetrics(self.clock()),
                      min_tokens_stops=stops_held_back(params, self.config.eos_token_ids),
                      cache_root=salt_root(cache_salt))
        req.metrics.num_prompt_tokens = len(ids)
        if resume is not None:
            check_resume(params, resume, self.config.vocab_size)
            check_resume_logprobs(params, resume, resume_logprobs)
            if resume_logprobs is not None:
                resume_logprobs = [lp[:] if lp is not None else None for lp in resume_logprobs]  # ours to extend
        elif resume_logprobs is not None:
            raise ValueError("resume_logprobs without resume: pass the children's tokens as resume= too")
        self.scheduler.add_request(req, resume)
        if resume_logprobs is not None:
            for seq in req.seqs:
                if resume_logprobs[seq.index] is not None:  # else recomputed into the empty one it has
                    seq.logprobs = resume_logprobs[seq.index]
        self.requests[request_id] = req
        return request_id

    def partial_outputs(self, request_id: str) -> list[Partial]:
        """Per child of a request in flight: (tokens generated so far, finish reason or None).

        A snapshot to continue from later with ``add_request(..., resume=...)``; children not forked
        yet have no tokens. KeyError for an id not in flight."""
        return self.requests[str(request_id)].partials()

    def new_tokens(self, request_id: str, seen: list[int]) -> list[Partial]:
        """Per child: (its generated tokens after the first ``seen[i]``, finish reason or None).

        What a stream has not sent yet, at a cost that follows the new tokens rather than the whole
        trajectory (``partial_outputs`` copies everything). KeyError for an id not in flight."""
        return self.requests[str(request_id)].partials(seen)

    def partial_logprobs(self, request_id: str, seen: list[int] | None = None) -> list[TokenLogprobs | None]:
        """Per child of a request in flight: its logprobs after the first ``seen[i]`` positions (all of
        them without ``seen``), as ``new_tokens`` / ``partial_outputs`` index its tokens; None per child
        when the request did not ask. KeyError for an id not in flight."""
        out = self.requests[str(request_id)].partial_logprobs(seen)
        for lp in out:
            if lp is not None:
                lp.decode = self._decode_token
        return out

    def prompt_logprobs(self, request_id: str) -> list | None:
        """The request's prompt logprobs (vLLM's shape: the first entry None) once its prompt is
        computed; None before, or when it did not ask. KeyError for an id not in flight."""
        req = self.requests[str(request_id)]
        if not req.prompt_logprobs_done:
            return None
        req.prompt_logprobs.decode = self._decode_token
        return prompt_logprobs_list(req.prompt_logprobs)

    def finished_text(self, request_id: str, index: int) -> str:
        """The final text of child ``index`` once it has finished, while its siblings may still run
        (what its CompletionOutput will hold). KeyError for an id not in flight."""
        seq = self.requests[str(request_id)].child(index)
        if seq.finish_reason is None:
            raise ValueError(f"child {index} of request {request_id!r} has not finished")
        return self.stop_checker.final_text(seq)

    def has_unfinished(self) -> bool:
        """Whether any request is in flight, or finished and not yet returned by step() (a step that
        raised StepError for others keeps them for the next)."""
        return bool(self.requests or self._outbox)

    def abort_request(self, request_id: str) -> None:
        """Drop a request in flight and free its KV blocks (unknown ids are ignored)."""
        req = self.requests.pop(str(request_id), None)
        if req is not None:
            self.scheduler.abort(req)

    # -- observers ---------------------------------------------------------------------------
    def add_observer(self, observer: StepObserver) -> None:
        """Call ``observer`` at fixed points of every step (engine/core/observers.py: StepObserver)."""
        self.hooks.add(observer)

    def remove_observer(self, observer: StepObserver) -> None:
        """Detach an observer added with add_observer."""
        self.hooks.remove(observer)

    # -- the step loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; returns the requests that finished in it (or in a step that failed after
        they finished).

        If the step fails, the requests it was running are aborted, their KV blocks freed, and
        StepError reports them with their tokens so far; every other request carries on.
        """
        hooks = self.hooks
        hooks.started()
        with hooks.phase("engine.schedule"):
            plan = self.scheduler.schedule()
        if not plan:
            return self._idle()
        hooks.planned(plan)
        now = self.clock()
        for seq, _ in plan.prefills:  # a request's queue time ends when its first chunk is scheduled
            seq.request.metrics.scheduled_time = seq.request.metrics.scheduled_time or now
        try:
            with hooks.phase("engine.model"):
                # self-drafting: the draft steps run first (what verification needs of them comes back)
                drafted = self.speculator.draft_with_model(plan, self.runner, self.sampler) if self.speculator else None
                logits, scored = self.runner.run(plan)
                hooks.model_done()
            with hooks.phase("engine.sample"):
                logits, failed = set_aside_non_finite(self, plan, logits, scored)
                runs = sample_runs(plan, logits, self.sampler, drafted)  # per sequence: several for a verified row
                finished = self.scheduler.postprocess(plan, runs)  # cuts each run at its stop
                record_logprobs(plan, logits, runs, scored, self.processed_logprobs)
        except Exception as e:
            raise fail_step(self, plan, e) from e
        if failed is not None:
            finished = abort_set_aside(self, failed, finished)
        self._close_step(plan, finished)
        hooks.finished(self._steps - 1, plan, self.block_manager)
        if failed is not None:
            raise failed  # the step is done for the others: what finished in it comes with the next step()
        return self._take_outbox()

    def _idle(self) -> list[RequestOutput]:
        if self.scheduler.has_work():
            raise RuntimeError("scheduler made no progress with work queued (engine bug)")
        return self._take_outbox()

    def _close_step(self, plan: StepPlan, finished: list[Request]) -> None:
        """Stamp first tokens, move finished requests to the outbox, count the step."""
        now = self.clock()
        for seq in plan.sample_seqs:
            if seq.request.metrics.first_token_time is None:
                seq.request.metrics.first_token_time = now
        self._outbox.extend(self._finish_request(req, now) for req in finished)
        self._steps += 1
        self._cascade_steps += plan.cascade

    def _take_outbox(self) -> list[RequestOutput]:
        done, self._outbox = self._outbox, []
        return done

    def _finish_request(self, req: Request, now: float) -> RequestOutput:
        del self.requests[req.request_id]
        req.metrics.finished_time = now
        req.metrics.num_generated_tokens = sum(s.num_generated for s in req.seqs)
        return req.output(self.stop_checker.final_text, self._decode_token)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run prompts (texts or token-id lists) to completion; outputs in prompt order.

        Requests added earlier with add_request keep running alongside; their outputs are returned
        by the next step(). If generate raises, the requests it added are aborted, no others.
        Safe to call from several threads: each call waits for the one running to return."""
        with self._generate_lock:
            return self._generate(prompts, params, use_tqdm)

    def _generate(self, prompts, params, use_tqdm: bool) -> list[RequestOutput]:
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

    def reset_peak_stats(self) -> None:
        """Restart stats()'s KV peaks (kv_blocks_peak, kv_blocks_peak_saved) from the present, e.g.
        to measure one round's peak."""
        self.block_manager.reset_peak()

    def describe(self) -> str:
        """One line for a person starting the engine: the model, dtype, weights (format, bytes), KV cache
        (format, tokens that fit, bytes per token), context length and devices. The pacore commands print it at start-up."""
        blocks = self.block_manager.num_blocks
        tp = self.options.tensor_parallel_size
        devices = f"{self.device}" + (f" x {tp} (tensor parallel)" if tp > 1 else "")
        if self.options.device_model:
            devices += f", rehearsing a modelled {self.options.device_model}"
        dtype = str(self.dtype).removeprefix("torch.")
        from engine.quant.fp8 import describe_weights
        return (f"engine: {self.config.path.name} ({self.config.architecture}), {dtype}, "
                f"{describe_weights(self.config, self.dtype)}, "
                f"KV cache {self.kv_cache_dtype}: {blocks * self.block_size:,} tokens ({blocks:,} blocks of "
                f"{self.block_size}), {self.kv_bytes_per_block // self.block_size:,} bytes per token, "
                f"context {self.max_model_len:,} tokens, device {devices}")

    def stats(self) -> dict:
        """Counters since start (tokens computed, tokens generated (each sequence's first too), prefix-cache hits, KV block peaks, preemptions) and
        the present (KV blocks used and shared by more than one sequence, sequences waiting and running).

        kv_blocks_peak_saved is the engine-wide peak of blocks that sharing saved at one time (the
        per-request figure is RequestOutput.metrics.kv_blocks_saved_by_sharing). kv_cache_dtype,
        kv_bytes_per_token and kv_cache_tokens describe the cache: its format, what one token costs
        (all layers, K and V, every rank) and how many tokens it holds. With speculative_config, the
        spec_decode_* counters too (engine/spec/speculator.py, SpecStats.as_dict; per request in
        RequestOutput.metrics)."""
        bm, sch = self.block_manager, self.scheduler
        return dict(
            prefill_tokens=sch.prefill_tokens,
            decode_tokens=sch.decode_tokens,
            generated_tokens=sch.generated_tokens,
            steps=self._steps,
            prefix_cache_hit_tokens=sch.prefix_hit_tokens,
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=bm.num_used,
            kv_blocks_shared=bm.num_shared,
            kv_blocks_peak=bm.peak_used,
            kv_blocks_peak_saved=bm.peak_saved,
            kv_bytes_per_block=self.kv_bytes_per_block,
            kv_cache_dtype=self.kv_cache_dtype,
            kv_bytes_per_token=self.kv_bytes_per_block // self.block_size,
            kv_cache_tokens=bm.num_blocks * self.block_size,
            preemptions=sch.num_preemptions,
            cascade_decode_steps=self._cascade_steps,
            num_waiting=len(sch.waiting),
            num_running=len(sch.running),
        ) | (self.speculator.stats.as_dict(self.speculator.policy) if self.speculator is not None else {})

