"""Verification-guided block selection's state (speculative_config ``selection`` "verify", Vegas-style):
per layer and buffer row of the model runner, the block importance of the row's last verify pass
(pacore_kernels/block_importance.py), which every draft step of the next cycle chooses its blocks by
(pacore_kernels/block_select.py, select_by_importance).

fp32 [layers, rows, max_blocks]: 4 bytes per layer, row and block-table column, no key bounds (PaCoRe-8B
at 256 rows and 131k tokens: 302 MB, against 1/16 of the cache for the bounds). A row never verified
(prefill, a fork's child, a preempted sequence back, a row taken by another sequence) holds -1, and its
draft steps read their sink and window alone. Each tensor-parallel rank keeps its own, from its heads.
"""
from __future__ import annotations

import torch


class BlockImportance:
    def __init__(self, num_layers: int, max_rows: int, max_blocks: int, device):
        self.values = torch.full((num_layers, max_rows, max_blocks), -1.0, dtype=torch.float32, device=device)

    def forget(self, row: int) -> None:
        """The row has no verify yet."""
        self.values[:, row] = -1.0

    def for_step(self, rows: torch.Tensor, width: int, draft: bool) -> torch.Tensor:
        """What a step's attention gets: a draft step its rows' importance [layers, B, width]; a verify
        step a zeroed tensor of that shape to fill (``store`` keeps it)."""
        if draft:
            return self.values[:, rows, :width]
        return torch.zeros(self.values.shape[0], len(rows), width, device=self.values.device)

    def store(self, rows: torch.Tensor, filled: torch.Tensor) -> None:
        """A verify step's importance; the columns past its width were not read: 0."""
        self.values[:, rows] = 0.0
        self.values[:, rows, :filled.shape[2]] = filled
