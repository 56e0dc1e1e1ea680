"""Per-step timeline records, for profiling rounds and KV-sharing research."""
from __future__ import annotations

from dataclasses import asdict, dataclass


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
