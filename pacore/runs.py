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
from dataclasses import dataclass, field

from .compaction import Trajectory
from .config import RunConfig
from .io import PriorResults, read_results, rounds_path
from .problems import Problem, problem_key, run_key
from .seeds import derive_seed
from .stats import RoundStats

POOL = "pool"  # the "run" of a pool's checkpoint record


def validate_runs(cfg: RunConfig) -> None:
    """Refuse --runs/--pool values that cannot work, naming the fix."""
    if cfg.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {cfg.runs}")
    k1 = cfg.schedule[0]
    if cfg.pool is not None and cfg.pool < k1:
        raise ValueError(f"--pool {cfg.pool} is smaller than round 1's K={k1}: each run draws {k1} trajectories "
                         f"from the pool without replacement; use --pool {k1} or more")


def unit_key(key: str, run: int | str) -> str:
    """The name of one run (or the pool) of a problem in request ids and snapshots; run 0 keeps the bare
    key, so a single run is named as before runs existed."""
    return key if run == 0 else f"{key}#{run}" if run == POOL else f"{key}#run{run}"


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
    return derive_seed(seed, key, 0, "sample", POOL)


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


@dataclass(slots=True)
class PriorWork:
    """What earlier sessions finished of one problem: done runs, checkpointed rounds, its pool."""

    runs_done: set[int] = field(default_factory=set)
    rounds: dict[int, list[dict]] = field(default_factory=dict)  # run -> checkpoint records of rounds 1..r
    pool: dict | None = None  # the pool's checkpoint record


def read_prior_work(cfg: RunConfig, todo: list, prior: PriorResults) -> dict[str, PriorWork]:
    """Problem key -> what earlier sessions left of it, for the problems in ``todo``.

    A run is done when it has a success record (or, with --skip-failed, only error records). Rounds
    count only as a gapless sequence from round 1 (from round 2 with a pool: round 1 is the draw).
    """
    problems = {x.key: x for x in todo if isinstance(x, Problem)}
    by_run: dict[str, dict[int, dict[int, dict]]] = {}
    pools: dict[str, dict] = {}
    for rec in read_results(rounds_path(cfg.out_path)):
        key = problem_key(rec.get("request_id"))
        if key not in problems or not isinstance(rec.get("round"), int):
            continue
        run = rec.get("run", 0)
        if run == POOL:
            pools[key] = rec
        elif isinstance(run, int):
            by_run.setdefault(key, {}).setdefault(run, {})[rec["round"]] = rec
    out: dict[str, PriorWork] = {}
    first = 2 if cfg.pool else 1
    for key, problem in problems.items():
        work = PriorWork(pool=pools.get(key))
        for run in range(cfg.runs):
            rk = run_key(problem.id, run)
            if rk in prior.done or (cfg.skip_failed and rk in prior.failed):
                work.runs_done.add(run)
            rounds = by_run.get(key, {}).get(run, {})
            seq = []
            while first + len(seq) in rounds:
                seq.append(rounds[first + len(seq)])
            if seq:
                work.rounds[run] = seq
        if work.runs_done or work.rounds or work.pool:
            out[key] = work
    return out


@dataclass(slots=True)
class Unit:
    """What one engine request belongs to: a run of a problem, or (run == POOL) the problem's pool."""

    problem: Problem
    gold: str | None
    run: int | str = 0
    round_idx: int = 0  # the round in flight, 0-based
    rounds: list[list[Trajectory]] = field(default_factory=list)  # each in its recorded (reference) order
    stats: list[RoundStats] = field(default_factory=list)
    pool: dict | None = None  # a run drawn from a pool: what it drew, for its record
    waiting: list[int] = field(default_factory=list)  # a pool: the runs that draw from it
    # the round in flight: its prompt, what it resumed, and bookkeeping for its stats
    prompt: list[int] = field(default_factory=list)
    resumed_tokens: int = 0
    references: int = 0
    dropped: int = 0
    truncated: int = 0
    truncated_tokens: int = 0

    @property
    def key(self) -> str:
        return unit_key(self.problem.key, self.run)


def runs_left(cfg: RunConfig, work: PriorWork | None) -> list[int]:
    """The runs of a problem this session still has to do."""
    done = work.runs_done if work else set()
    return [run for run in range(cfg.runs) if run not in done]


def planned(cfg: RunConfig, runs: int) -> tuple[int, int]:
    """(trajectories, rounds) that ``runs`` runs of a problem generate, for the progress bar."""
    schedule = cfg.schedule
    if not cfg.pool:
        return runs * sum(schedule), runs * len(schedule)
    return cfg.pool + runs * sum(schedule[1:]), 1 + runs * (len(schedule) - 1)


def usable_pool(cfg: RunConfig, work: PriorWork | None) -> dict | None:
    """The problem's checkpointed pool, if it was sampled with this --pool and --seed."""
    rec = work.pool if work else None
    return rec if rec is not None and (rec.get("k"), rec.get("seed")) == (cfg.pool, cfg.seed) else None


def usable_rounds(cfg: RunConfig, work: PriorWork | None, run: int, first: int) -> tuple[list[dict], bool]:
    """A run's checkpointed rounds from round ``first`` + 1 on, short of the final round, and whether
    they had to be dropped because they were run with other settings."""
    schedule = cfg.schedule
    records = (work.rounds.get(run, []) if work else [])[: len(schedule) - 1 - first]
    expected = [(k, cfg.seed, cfg.shuffle, cfg.pool) for k in schedule[first:]]
    if any((rec.get("k"), rec.get("seed"), rec.get("shuffle"), rec.get("pool")) != want
           for rec, want in zip(records, expected)):
        return [], True
    return records, False

