"""One tqdm bar over trajectories, with rounds done and live tokens/s."""
from __future__ import annotations

import time

from tqdm import tqdm


class Progress:
    """Trajectory progress bar; the tokens/s postfix reads the engine's live decode counter."""

    _REFRESH_S = 0.5

    def __init__(self, llm, total_trajectories: int, total_rounds: int, enabled: bool = True,
                 desc: str = "pacore", position: int = 0):
        self._llm = llm
        # position: the bar's line, so the replicas of a data-parallel run each keep one
        self._bar = tqdm(total=total_trajectories, unit="traj", desc=desc, disable=not enabled,
                         dynamic_ncols=True, position=position)
        self._enabled = enabled
        self._rounds_total = total_rounds
        self._rounds_done = 0
        self._finished_tokens = 0
        self._t0 = time.perf_counter()
        self._tokens0 = self._live_tokens()
        self._last = 0.0

    def _live_tokens(self) -> int | None:
        try:
            return int(self._llm.stats()["decode_tokens"])
        except Exception:
            return None  # an engine without the counter: fall back to finished rounds

    def round_done(self, trajectories: int, generated_tokens: int) -> None:
        self._rounds_done += 1
        self._finished_tokens += generated_tokens
        self._bar.update(trajectories)
        self.tick(force=True)

    def problem_failed(self, trajectories_left: int, rounds_left: int) -> None:
        # Shrink the totals so the bar still ends at 100% when a problem drops out.
        self._bar.total = max(self._bar.n, self._bar.total - trajectories_left)
        self._rounds_total -= rounds_left
        self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        if not self._enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last < self._REFRESH_S:
            return
        self._last = now
        live = self._live_tokens()
        tokens = live - self._tokens0 if live is not None and self._tokens0 is not None else self._finished_tokens
        elapsed = max(now - self._t0, 1e-9)
        self._bar.set_postfix_str(f"rounds {self._rounds_done}/{self._rounds_total}, {tokens / elapsed:.1f} tok/s")

    def close(self) -> None:
        self._bar.close()
