"""Independent runs of each problem and the round-1 pool they draw from: the paper's evaluation protocol.

The paper (section 3.2) reports pass@1 averaged over independent runs of each problem (64 on AIME
2025, HMMT 2025 and Apex, 8 on IMOAnswerBench, LiveCodeBench and MultiChallenge) and, to save
compute, pre-generates a pool of round-1 trajectories per problem (512) from which each run draws
its K1. ``--runs R`` runs every problem R times with seeds derived per run; their round-1 requests
share one prompt, which the prefix cache prefills once. ``--pool M`` samples M round-1 trajectories
once per problem (one request with n=M) and each run draws K1 of them without replacement.
"""
from __future__ import annotations

import random

from ..compaction import Trajectory
from ..config import RunConfig
from ..results.keys import POOL_RUN
from ..seeds import derive_seed
from .stats import RoundStats


def validate_runs(cfg: RunConfig) -> None:
    """Refuse --runs/--pool values that cannot work, naming the fix."""
    if cfg.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {cfg.runs}")
    k1 = cfg.schedule[0]
    if cfg.pool is not None and cfg.pool < k1:
        raise ValueError(f"--pool {cfg.pool} is smaller than round 1's K={k1}: each run draws {k1} trajectories "
                         f"from the pool without replacement; use --pool {k1} or more")


def _run_parts(run: int) -> tuple:
    # Run 0 derives exactly as a single run always has, so --runs 1 reproduces earlier results.
    return () if run == 0 else (run,)


def sample_seed(seed: int, key: str, run: int, round_idx: int) -> int:
    """The sampling seed of a run's round (0-based); independent of scheduling and of the other runs."""
    return derive_seed(seed, key, round_idx, "sample", *_run_parts(run))


def shuffle_seed(seed: int, key: str, run: int, round_no: int) -> int:
    """The seed of ``--shuffle seeded`` for a run's round (1-based)."""
    return derive_seed(seed, key, round_no, "shuffle", *_run_parts(run))


def pool_seed(seed: int, key: str) -> int:
    return derive_seed(seed, key, 0, "sample", POOL_RUN)


def draw(pool_size: int, k: int, seed: int, key: str, run: int) -> list[int]:
    """The pool indices run ``run`` takes (K of them, without replacement), ascending."""
    return sorted(random.Random(derive_seed(seed, key, run, "draw")).sample(range(pool_size), k))


def drawn_round(pool: list[Trajectory], pool_stats: dict, indices: list[int], k: int) -> tuple[list[Trajectory],
                                                                                                 RoundStats]:
    """A run's round 1 taken from the pool: its trajectories (pool order) and stats.

    generated_tokens counts the drawn trajectories (the run's effective compute, as the paper defines
    it); the engine's costs (prefix hits, KV saved) were the pool request's and are counted once, with it.
    """
    by_index = {t.index: t for t in pool}
    trajs = [by_index[i] for i in indices]
    counts: dict[str, int] = {}
    for t in trajs:
        counts[str(t.finish_reason)] = counts.get(str(t.finish_reason), 0) + 1
    stats = RoundStats(
        round=1, k=k, prompt_tokens=pool_stats["prompt_tokens"], generated_tokens=sum(t.tokens for t in trajs),
        prefill_time_s=pool_stats["prefill_time_s"], decode_time_s=pool_stats["decode_time_s"],
        tokens_per_s=pool_stats["tokens_per_s"], prefix_cache_hit_tokens=0, kv_blocks_saved_by_sharing=0,
        references=0, dropped_messages=0, truncated_messages=0, finish_reasons=counts, pool=len(pool))
    return trajs, stats


def planned(cfg: RunConfig, runs: int) -> tuple[int, int]:
    """(trajectories, rounds) that ``runs`` runs of a problem generate, for the progress bar."""
    schedule = cfg.schedule
    if not cfg.pool:
        return runs * sum(schedule), runs * len(schedule)
    return cfg.pool + runs * sum(schedule[1:]), 1 + runs * (len(schedule) - 1)
