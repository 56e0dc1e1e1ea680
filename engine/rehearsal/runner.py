"""The rehearsal's model runner and sampler: the real step preparation, a modelled device behind it.

``RehearsalRunner`` is a ModelRunner without weights or KV tensors: ``prepare`` (the persistent
block-table rows, slot mappings, attention metadata) runs for real, then the step's cost comes from
the device model and advances a virtual clock instead of running kernels. ``ScriptedSampler`` emits
each trajectory's tokens from a workload: ``think`` filler tokens, the tokens of ``</think>``, a
conclusion of the given length, then EOS, so the next PaCoRe round's prompt has its real size.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from engine.worker.kv_cache import resolve_kv_dtype
from engine.worker.model_runner import ModelRunner
from engine.device_model import (DecodeGroup, DeviceParams, DraftRead, ModelShape, PrefillChunk, StepCost,
                                 StepWork, bounds_tokens, kv_tokens, step_cost)
from engine.rehearsal.floor import FloorBytes, RequestRows, step_floor
from engine.core.step_plan import StepPlan, request_runs
from engine.core.sequence import Sequence

END_THINK = "</think>"


class Workload(Protocol):
    """Lengths for each trajectory of a rehearsal."""

    def lengths(self, request_id: str, index: int, prompt_tokens: int, max_tokens: int) -> tuple[int, int]:
        """(tokens to generate, EOS included; tokens of the conclusion after ``</think>``)."""


class RunToLimit:
    """The default workload: every trajectory runs until its max_tokens (the context), with a
    conclusion of ``conclusion`` tokens."""

    def __init__(self, conclusion: int = 1024):
        self.conclusion = conclusion

    def lengths(self, request_id: str, index: int, prompt_tokens: int, max_tokens: int) -> tuple[int, int]:
        return max_tokens + 1, min(self.conclusion, max(0, max_tokens - 1))


@dataclass(slots=True)
class VirtualClock:
    """Seconds of modelled device time since the engine started."""

    now_s: float = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass(slots=True)
class StepSample:
    """One rehearsed step: its modelled cost, the host's real time, and the cache's state."""

    step: int
    start_s: float  # virtual
    cost: StepCost
    prepare_s: float  # host: ModelRunner.prepare, measured
    num_decodes: int
    num_prefill_tokens: int
    kv_blocks_used: int = 0
    cascade: bool = False


@dataclass(slots=True)
class Ledger:
    """What a rehearsal accumulates: totals, each request's share, and a sample per step."""

    total: StepCost = field(default_factory=StepCost)
    by_account: dict[object, StepCost] = field(default_factory=dict)  # RehearsalRunner.account_by -> cost
    generated: dict[object, int] = field(default_factory=dict)  # account -> tokens sampled
    steps: list[StepSample] = field(default_factory=list)
    recompute_tokens: int = 0
    # self-drafting's draft steps (already in total and by_account): their share, by account
    drafts: dict[object, StepCost] = field(default_factory=dict)
    floor: dict[object, FloorBytes] = field(default_factory=dict)  # account -> the floor's bytes (floor.py)


class RehearsalRunner(ModelRunner):
    """A ModelRunner whose forward pass is the device model (see the module docstring)."""

    def __init__(self, cfg, dtype: torch.dtype, block_size: int, max_num_seqs: int, max_model_len: int,
                 device: DeviceParams, keep_steps: bool = True, kv_cache_dtype: str = "auto",
                 draft_select: tuple[int, int, int] | None = None, speculative=None, **_ignored):
        # No ModelRunner.__init__: it would load the weights. What prepare() needs is set here.
        self.cfg, self.dtype, self.device, self.block_size = cfg, dtype, torch.device("cpu"), block_size
        self.workers, self.is_worker, self.tp_size = None, False, 1
        self.graphs = None
        self.draft_select = None if draft_select is None else self.select_spans(*draft_select)
        self.key_bounds = None
        # self-drafting's draft step as the device model prices it (speculative: the engine's SpeculativeConfig)
        self.draft_read = (DraftRead.of(speculative, block_size)
                           if speculative is not None and speculative.method == "self_window" else None)
        self.kv_cache = None  # no tensor: the cache is the block manager's bookkeeping only
        self.cascade, self.batch_invariant = True, False
        self.max_blocks = -(-max_model_len // block_size)
        self.tables = torch.zeros(max_num_seqs, self.max_blocks, dtype=torch.int32)
        self.synced = [0] * max_num_seqs
        self.writes: list = []
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.max_num_seqs = max_num_seqs
        self.device_params = device
        self.kv_dtype = resolve_kv_dtype(kv_cache_dtype, dtype)  # FP8: one byte per KV value, a what-if
        self.shape = ModelShape.from_config(cfg, dtype.itemsize, self.kv_dtype.itemsize)
        self.draft_shape = self.shape if self.draft_read is None else self.draft_read.shape(self.shape)
        self.clock = VirtualClock()
        self.ledger = Ledger()
        self.keep_steps = keep_steps
        self.trace: list[StepWork] | None = None  # a list: every step's work (draft steps too), to price again
        self.account_by: Callable[[str], object] = str  # request id -> the account its costs go to
        self.used_blocks: Callable[[], int] = lambda: 0
        self.shared_prefix: Callable[[object], int] = lambda req: 0  # tokens a request's running rows share
        self._plain_ops = self.ops = None
        self._drafted = (StepCost(), 0.0)  # this step's draft steps so far: their cost, their host time
        # seq id -> positions it has computed once (a forked child: from its first decode); a prefill
        # below that mark is recompute, after a preemption
        self._computed: dict[int, int] = {}

    @property
    def kv_bytes_per_block(self) -> int:
        """A block's KV; with sparse self-drafting by key bounds, the bounds too (2 x Hkv x D per layer in the
        model's dtype; selection "verify" keeps none)."""
        kv = self.shape.kv_bytes_per_token * self.block_size
        return kv + (bounds_tokens(self.shape) * self.shape.kv_bytes_per_token if self._keeps_bounds() else 0)

    def _keeps_bounds(self) -> bool:
        if self.draft_read is not None:
            return self.draft_read.bounds
        return self.draft_select is not None  # a runner made without the config: sparse means bounds

    def bind(self, scheduler, block_manager) -> None:
        """Read the cache's occupancy and each request's shared prefix from the engine's own parts."""
        self.used_blocks = lambda: block_manager.num_used
        self.shared_prefix = scheduler.shared_prefix_tokens

    def auto_num_blocks(self, kv_cache_memory: int | None, gpu_memory_utilization: float) -> int:
        """The blocks the engine's sizing would give on the modelled device (or in kv_cache_memory)."""
        if kv_cache_memory is not None:
            return max(1, kv_cache_memory // self.kv_bytes_per_block)
        # kv_tokens prices a token's K and V only: the key bounds of sparse self-drafting take their share too
        tokens = kv_tokens(self.shape, self.device_params, gpu_memory_utilization)
        return max(1, int(tokens * self.shape.kv_bytes_per_token // self.kv_bytes_per_block))

    def mark_ranges(self, on: bool) -> None:
        """No kernels run, so there are no op ranges to mark."""

    def allocate_kv_cache(self, num_blocks: int, cuda_graphs: bool) -> None:
        self.num_blocks = num_blocks  # bookkeeping only: no tensor

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        if seq.is_finished:
            self._computed.pop(seq.seq_id, None)

    def trimmed(self, seq: Sequence) -> None:
        """A verify row has settled: the scheduler advanced it by the tokens it kept (up to a stop) and
        dropped its rejected drafts' blocks. run() counted its first token; the rest are counted here,
        so the ledger's generated tokens are the tokens emitted, not the queries run."""
        super().trimmed(seq)
        extra = seq.num_computed - self._computed.get(seq.seq_id, seq.num_computed)
        if extra > 0:
            k = self.account_by(seq.request.request_id)
            self.ledger.generated[k] = self.ledger.generated.get(k, 0) + extra
        self._computed[seq.seq_id] = seq.num_computed

    def work(self, plan: StepPlan) -> StepWork:
        """The plan as the device model reads it, recomputed positions found from what each sequence
        had computed before."""
        work = StepWork(sampled=len(plan.sample_seqs))
        for seq, chunk in plan.prefills:
            rid = seq.request.request_id
            start = seq.num_computed
            redo = max(0, min(self._computed.get(seq.seq_id, 0), start + chunk) - start)
            self.ledger.recompute_tokens += redo
            work.prefills.append(PrefillChunk(rid, start, chunk, redo))
            self._computed[seq.seq_id] = max(self._computed.get(seq.seq_id, 0), start + chunk)
        decodes, drafts = plan.decodes, plan.drafts
        if plan.cascade:  # cascade groups: one request's rows each, or (scope "batch") every row of the step
            spans = list(zip(plan.group_starts, plan.group_starts[1:], plan.group_prefix_lens))
        else:
            spans = [(i, j, 0) for i, j in request_runs(decodes)]
        for i, j, cascade in spans:
            req = decodes[i].request
            # a verify row's queries: its last token and its drafts, each row's KV read once for all
            queries = [1 + len(drafts.get(s.seq_id, ())) for s in decodes[i:j]] if drafts else None
            lens = [s.num_computed + q for s, q in zip(decodes[i:j], queries or [1] * (j - i))]
            for s in decodes[i:j]:
                self._computed[s.seq_id] = s.num_computed + 1  # a verify row's kept drafts: trimmed()
            one_request = all(s.request is req for s in decodes[i:j])
            shared = (self.shared_prefix(req) if one_request else cascade) if j - i > 1 else 0
            work.decodes.append(DecodeGroup(req.request_id, lens, shared, cascade, queries))
        return work

    def _charge(self, cost: StepCost, per: dict[object, StepCost]) -> None:
        self.ledger.total.add(cost)
        for k, c in per.items():
            self.ledger.by_account.setdefault(k, StepCost()).add(c)
        self.clock.now_s += cost.total

    def _floor(self, plan: StepPlan, work: StepWork) -> None:
        """The floor's bytes of this target step (engine/rehearsal/floor.py): each request's rows together,
        whatever groups the step's kernels formed, and only the prompt tokens computed for the first time."""
        decodes, drafts, key = plan.decodes, plan.drafts, self.account_by
        rows = []
        for i, j in request_runs(decodes):
            req = decodes[i].request
            rows.append(RequestRows(key(req.request_id), [s.num_computed for s in decodes[i:j]],
                                    [1 + len(drafts.get(s.seq_id, ())) for s in decodes[i:j]],
                                    self.shared_prefix(req) if j - i > 1 else 0))
        prefill = [(key(c.request_id), c.length - c.recompute) for c in work.prefills]
        for k, f in step_floor(rows, prefill, self.shape).items():
            self.ledger.floor.setdefault(k, FloorBytes()).add(f)

    @torch.inference_mode()
    def run_draft(self, seqs: list[Sequence], tokens: list[int], offset: int, window: int, sink: int,
                  window_fraction: float = 0.0, selected: int = 0) -> torch.Tensor:
        """A self-drafting step: its inputs prepared for real (ModelRunner.prepare_draft), its cost
        modelled as device_model.DraftRead prices it (the drafted layers' weights and the LM head once; per
        row, over the drafted layers, the KV of its sink and window, any selected blocks and key bounds, and its
        store; its logits sampled) and folded into the step's sample. The drafts' tokens are the draft
        sampler's (engine/rehearsal/drafter.py), so the logits are placeholders."""
        t0 = time.perf_counter()
        self.prepare_draft(seqs, tokens, offset, window, sink, window_fraction, selected)
        prepare_s = time.perf_counter() - t0
        work = StepWork(sampled=len(seqs))
        # the engine's config when it gave one (selection, draft_layers), else what this call names
        draft = self.draft_read or DraftRead(window, sink, window_fraction, selected, block_size=self.block_size)
        for i, j in request_runs(seqs):
            work.decodes.append(DecodeGroup(seqs[i].request.request_id,
                                            [draft.tokens(s.num_computed + offset + 1, self.shape) for s in seqs[i:j]]))
        cost, per = step_cost(work, self.draft_shape, self.device_params, self.account_by)
        self._charge(cost, per)
        if self.trace is not None:
            self.trace.append(work)
        for k, c in per.items():
            self.ledger.drafts.setdefault(k, StepCost()).add(c)
        drafted, host = self._drafted
        drafted.add(cost)
        self._drafted = drafted, host + prepare_s
        return torch.empty(len(seqs), 0)

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> tuple[torch.Tensor, None]:
        t0 = time.perf_counter()
        self.prepare(plan)  # the real host work of a step: table rows, slots, metadata
        prepare_s = time.perf_counter() - t0
        work = self.work(plan)
        cost, per = step_cost(work, self.shape, self.device_params, self.account_by)
        if self.trace is not None:
            self.trace.append(work)
        ledger = self.ledger
        if self.keep_steps:  # one sample per engine step: its draft steps' cost and host time with it
            drafted, host = self._drafted
            step = StepCost()
            step.add(cost)
            step.add(drafted)
            ledger.steps.append(StepSample(len(ledger.steps), self.clock.now_s - drafted.total, step, prepare_s + host,
                                           len(plan.decodes), sum(n for _, n in plan.prefills), self.used_blocks(),
                                           plan.cascade))
        self._drafted = (StepCost(), 0.0)
        self._charge(cost, per)
        self._floor(plan, work)
        generated, offsets = ledger.generated, plan.sample_offsets
        for i, seq in enumerate(plan.sample_seqs):
            if offsets and offsets[i]:
                continue  # a verify row's later queries: the tokens it keeps are counted by trimmed()
            k = self.account_by(seq.request.request_id)
            generated[k] = generated.get(k, 0) + 1
        return torch.empty(len(plan.sample_seqs), 0), None  # the scripted sampler reads no logits; no logprobs


class ScriptedSampler:
    """Tokens that follow a workload. A trajectory's first token is its child index (so siblings
    never share a generated block, as sampled ones would not), then filler, ``</think>``, a
    conclusion of filler and EOS."""

    def __init__(self, tokenizer, eos_token_id: int, workload: Workload | None = None):
        if tokenizer is None:
            raise ValueError("a rehearsal needs a tokenizer (its trajectories are text): pass tokenizer=FOLDER")
        self.workload = workload or RunToLimit()
        self.filler = _single_token(tokenizer, (" x", "x"))
        self.end_think = tokenizer.encode(END_THINK, add_special_tokens=False)
        self.eos = eos_token_id
        self.first_ids = min(1000, tokenizer.vocab_size // 2)  # ids from here name the child index
        self.vocab = tokenizer.vocab_size
        self._plans: dict[int, tuple[int, int]] = {}  # seq id -> (end of thinking, end of conclusion)

    def plan_for(self, seq: Sequence) -> tuple[int, int]:
        p = self._plans.get(seq.seq_id)
        if p is None:
            total, conclusion = self.workload.lengths(seq.request.request_id, seq.index, seq.num_prompt_tokens,
                                                      seq.params.max_tokens)
            body = max(1, int(total)) - 1  # the tokens before EOS
            if body < len(self.end_think):  # too short to conclude: filler only
                p = (body, body)
            else:
                conclusion = max(0, min(int(conclusion), body - len(self.end_think)))
                p = (body - len(self.end_think) - conclusion, body)
            self._plans[seq.seq_id] = p
        return p

    def token(self, seq: Sequence, g: int) -> int:
        """The token ``seq`` generates at its generated position ``g`` (EOS from its end on)."""
        think_end, conclusion_end = self.plan_for(seq)
        if g >= conclusion_end:
            self._plans.pop(seq.seq_id, None)
            return self.eos
        if g == 0 and think_end > 0:
            salt = zlib.crc32(seq.request.request_id.encode())
            return self.first_ids + (seq.index + salt) % (self.vocab - self.first_ids)
        if g < think_end:
            return self.filler
        if g < think_end + len(self.end_think):
            return self.end_think[g - think_end]
        return self.filler

    def keys(self, seqs: list[Sequence], offsets: list[int] | None = None) -> torch.Tensor:
        """As Sampler.keys (self-drafting asks for them): zeros, the script decides."""
        return torch.zeros(len(seqs), dtype=torch.int64)

    def random_keys(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int64)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], offsets: list[int] | None = None,
                 keys: torch.Tensor | None = None) -> list[int]:
        """As Sampler: entry i is seqs[i]'s token ``offsets[i]`` positions after its next one (``keys``, the
        noise, unused: the script decides). As self-drafting's draw, it drafts the script's tokens: every
        draft right (engine/rehearsal/drafter.py's ScriptedSelfDrafts makes some wrong)."""
        if not offsets:
            return [self.token(s, s.num_generated) for s in seqs]
        return [self.token(s, s.num_generated + o) for s, o in zip(seqs, offsets)]


def _single_token(tokenizer, candidates: tuple[str, ...]) -> int:
    """The first candidate that is one token, and decodes and re-encodes to one per repeat (so a
    conclusion of C filler tokens is C tokens again in the next round's prompt)."""
    for text in candidates:
        ids = tokenizer.encode(text * 8, add_special_tokens=False)
        if len(ids) == 8 and len(set(ids)) == 1:
            return ids[0]
    raise ValueError(f"none of the rehearsal's fillers {candidates} is a token that repeats as itself in this "
                     "tokenizer; give the rehearsal another tokenizer (tokenizer=FOLDER)")

