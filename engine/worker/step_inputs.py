"""StepInputs: the model runner's tensors of one step (made from a StepPlan), what every tensor-parallel rank
runs: rank 0 prepares them once and sends them to the others (engine/worker/tp_workers.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.worker.attention import AttentionMetadata


@dataclass(slots=True)
class StepInputs:
    """One step's host tensors: what every tensor-parallel rank needs to run its shard."""

    ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_idx: torch.Tensor  # hidden rows that get logits
    copies: list[tuple[int, int]]  # a fork's block copies, made after the forward
    graph: bool  # replay a captured decode graph
    # "prefill"/"decode" -> (rows of the block-table buffer, width in blocks): each rank gathers its
    # own tables, so a step sends O(batch) entries, not [batch, context / block_size] tables
    tables: dict[str, tuple[torch.Tensor, int]]
    table_writes: list[tuple[int, int, list[int]]]  # (row, start, blocks) new since the last step
    # Scored rows (plan.scored): hidden rows whose logits score the next token, that token, the top-N
    # to keep, and per row the SamplingParams to process the distribution with (None: raw)
    scored_idx: torch.Tensor | None = None
    scored_targets: torch.Tensor | None = None
    scored_top: int = 0
    scored_params: list | None = None
    draft: bool = False  # a self-drafting step: windowed attention, never the batch-invariant ops
