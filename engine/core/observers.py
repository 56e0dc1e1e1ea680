"""Step hooks: the StepObserver interface, the StepRecord each step hands it, and StepHooks, the
LLM's side of both (who is attached, the step log, the timings a record is built from)."""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Callable

import torch


@dataclass(slots=True)
class StepRecord:
    step: int
    kind: str                 # "prefill", "decode" or "mixed"
    num_prefill_seqs: int
    num_decode_seqs: int
    num_tokens: int
    cascade: bool
    schedule_s: float         # host: choosing the batch, allocating blocks
    model_s: float            # batch tensors + forward + logits (synchronised on CUDA)
    sample_s: float           # sampling, stop checks, forks, finishing requests
    kv_blocks_used: int       # physical blocks held
    kv_blocks_shared: int     # of those, blocks with ref count > 1
    kv_blocks_logical: int    # blocks the same sequences would hold without any sharing

    def to_dict(self) -> dict:
        return asdict(self)


class StepObserver:
    """Called by ``LLM.step`` at fixed points of every step (``LLM.add_observer``); override what
    you need. ``ranges = True`` asks the engine to mark its phases (engine.schedule, engine.model,
    engine.sample) and kernel ops with torch.profiler ranges while the observer is attached."""

    ranges = False

    def step_started(self) -> None:
        """Before the scheduler plans the step."""

    def step_planned(self, plan) -> None:
        """The StepPlan about to run (sequences not advanced yet)."""

    def step_finished(self, record: StepRecord) -> None:
        """After sampling and finishing: the step's timings and KV occupancy."""


class StepHooks:
    """The observers attached to one LLM and, with record_steps, its log of StepRecords.

    ``LLM.step`` calls started / planned / model_done / finished in that order; they time the
    phases and, only while someone listens, synchronise CUDA so model_s is the forward's real time.
    mark_ranges: the model runner's switch for profiler ranges around its kernel ops."""

    def __init__(self, record_steps: bool, device: torch.device, mark_ranges: Callable[[bool], None]):
        self.observers: list[StepObserver] = []
        self.record_steps = record_steps
        self.log: list[StepRecord] = []
        self._device = device
        self._mark_ranges = mark_ranges
        self._ranges = False
        self._t0 = self._t1 = self._t2 = 0.0

    @property
    def listening(self) -> bool:
        return self.record_steps or bool(self.observers)

    def add(self, observer: StepObserver) -> None:
        self.observers.append(observer)
        self._update_ranges()

    def remove(self, observer: StepObserver) -> None:
        self.observers.remove(observer)
        self._update_ranges()

    def _update_ranges(self) -> None:
        self._ranges = any(o.ranges for o in self.observers)
        self._mark_ranges(self._ranges)

    def phase(self, name: str):
        """A torch.profiler range named ``name`` while a ranges observer is attached."""
        if not self._ranges:
            return nullcontext()
        from torch.profiler import record_function
        return record_function(name)

    def started(self) -> None:
        for o in self.observers:
            o.step_started()
        self._t0 = time.perf_counter()

    def planned(self, plan) -> None:
        for o in self.observers:
            o.step_planned(plan)
        self._t1 = time.perf_counter()

    def model_done(self) -> None:
        """The forward is launched; on CUDA, wait for it if anyone times the step."""
        if self._device.type == "cuda" and self.listening:
            torch.cuda.synchronize(self._device)
        self._t2 = time.perf_counter()

    def finished(self, step: int, plan, block_manager) -> None:
        """Build the step's StepRecord (timings, KV occupancy now), log it and hand it on."""
        if not self.listening:
            return
        bm = block_manager
        record = StepRecord(step, plan.kind, len(plan.prefills), len(plan.decodes), plan.num_tokens, plan.cascade,
                            self._t1 - self._t0, self._t2 - self._t1, time.perf_counter() - self._t2,
                            bm.num_used, bm.num_shared, bm.num_logical)
        if self.record_steps:
            self.log.append(record)
        for o in self.observers:
            o.step_finished(record)
