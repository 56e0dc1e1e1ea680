"""A runner's journal: what it writes (records, round checkpoints, snapshots) and what it continues
from (an earlier session's done runs, checkpointed rounds, pool and snapshots).

The round state machine (runner.py) asks it; where the output goes is its sink (sink.py): the files
beside the results file, or the driver of a replicated run.
"""
from __future__ import annotations

import sys

from ..compaction import Trajectory
from ..config import RunConfig
from ..evaluate.stats import RoundStats
from .keys import POOL_RUN
from .resume import PriorWork, runs_left, usable_pool, usable_rounds
from .shapes import restored_round
from .snapshots import snapshot_logprobs, snapshot_record, usable_snapshot


class Journal:
    """The output and the prior work of one runner, over its sink."""

    def __init__(self, cfg: RunConfig, sink):
        self.cfg = cfg
        self.sink = sink
        self.prior: dict[str, PriorWork] = {}

    # -- what earlier sessions did -----------------------------------------------------------
    def runs_left(self, problem_key: str) -> list[int]:
        """The runs of a problem this session still has to do."""
        return runs_left(self.cfg, self.prior.get(problem_key))

    def pool(self, problem_key: str) -> tuple[list[Trajectory], dict] | None:
        """A problem's checkpointed pool, if it was sampled with this --pool and --seed: its trajectories
        and its stats."""
        rec = usable_pool(self.cfg, self.prior.get(problem_key))
        if rec is None:
            return None
        trajectories, stats = restored_round(rec)  # checked as it was read (resume.read_prior_work)
        return trajectories, stats.to_dict()

    def restore(self, problem, run: int, first: int) -> list[tuple[list[Trajectory], RoundStats, int]]:
        """The rounds of a run an earlier session finished from round ``first`` + 1 on, if they match this
        run's settings: per round, its trajectories (recorded order), its stats and its K."""
        records, dropped = usable_rounds(self.cfg, self.prior.get(problem.key), run, first)
        if dropped:
            print(f"pacore: problem {problem.id!r} run {run}: its checkpointed rounds were run with "
                  f"another --rounds/--seed/--shuffle/--pool; starting it over", file=sys.stderr)
        return [(*restored_round(rec), rec["k"]) for rec in records]  # checked as they were read

    def resume_tokens(self, unit_key: str, round_no: int, k: int, prompt: list[int], num_top: int | None = None):
        """The trajectories of the round's snapshot, if it was taken with the same K, seed and prompt, and
        their logprobs if it holds them with ``num_top`` top entries (None when the round asks for none)."""
        rec = self.sink.load_snapshot(unit_key, round_no)
        partial = usable_snapshot(rec, unit_key, k, self.cfg.seed, prompt)
        if partial is None:
            return None
        return partial, snapshot_logprobs(rec, num_top)

    # -- what this session does --------------------------------------------------------------
    def record(self, record: dict) -> None:
        self.sink.record(record)

    def checkpoint(self, problem_id, run: int | None, round_no: int, trajectories: list[Trajectory],
                   stats: RoundStats) -> None:
        """A finished round, for --resume (``run`` None: the problem's pool)."""
        cfg = self.cfg
        self.sink.checkpoint({"request_id": problem_id, "run": POOL_RUN if run is None else run, "round": round_no,
                              "k": len(trajectories), "seed": cfg.seed, "shuffle": cfg.shuffle, "pool": cfg.pool,
                              "responses": [t.to_record() for t in trajectories], "stats": stats.to_dict()})

    def snapshot(self, unit_key: str, round_no: int, prompt: list[int], partial: list,
                 logprobs: list | None = None) -> None:
        """Save a round in flight (each trajectory's tokens so far, and their logprobs when given),
        unless nothing was generated yet."""
        if any(tokens for tokens, _ in partial):
            self.sink.snapshot(snapshot_record(unit_key, round_no, len(partial), self.cfg.seed, prompt, partial,
                                               logprobs))

    def round_saved(self, unit_key: str, round_no: int) -> None:
        """The round is on disk (recorded or checkpointed): its snapshot goes."""
        self.sink.drop_snapshot(unit_key, round_no)

    def closed(self, problem_key: str) -> None:
        self.sink.closed(problem_key)
