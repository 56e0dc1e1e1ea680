"""What the runner moves through its rounds: a run of a problem (``Unit``), or a problem's round-1 pool
(``Pool``) that its runs draw from, each with the round it has in the engine (``InFlight``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .compaction import Trajectory
from .config import RunConfig
from .evaluate.runs import planned, pool_seed, sample_seed
from .evaluate.stats import RoundStats
from .results.keys import pool_key, unit_key
from .results.problems import Problem


@dataclass(slots=True)
class InFlight:
    """A round in the engine: its prompt, the tokens it resumed, and what its stats report."""

    prompt: list[int] = field(default_factory=list)
    resumed_tokens: int = 0
    references: int = 0
    dropped: int = 0
    truncated: int = 0
    truncated_tokens: int = 0


@dataclass(slots=True)
class Unit:
    """One run of a problem, advancing through its rounds."""

    problem: Problem
    gold: str | None
    run: int = 0
    round_idx: int = 0  # the round in flight, 0-based
    rounds: list[list[Trajectory]] = field(default_factory=list)  # each in its recorded (reference) order
    stats: list[RoundStats] = field(default_factory=list)
    pool: dict | None = None  # a run drawn from a pool: what it drew, for its record
    current: InFlight = field(default_factory=InFlight)

    @property
    def key(self) -> str:
        return unit_key(self.problem.key, self.run)

    @property
    def runs(self) -> list[int]:
        return [self.run]

    def sampling(self, cfg: RunConfig) -> tuple[int, int]:
        """(n, seed) of its round in flight; per problem, run and round, so results do not depend on
        what else was scheduled."""
        return cfg.schedule[self.round_idx], sample_seed(cfg.seed, self.problem.key, self.run, self.round_idx)

    def left(self, cfg: RunConfig) -> tuple[int, int]:
        """(trajectories, rounds) it still had to generate, for the progress bar."""
        return sum(cfg.schedule[self.round_idx:]), len(cfg.schedule) - self.round_idx


@dataclass(slots=True)
class Pool:
    """A problem's round-1 pool: one request with n=--pool whose trajectories its runs draw from."""

    problem: Problem
    gold: str | None
    runs: list[int]  # the runs that draw from it
    current: InFlight = field(default_factory=InFlight)
    round_idx = 0  # a pool is always round 1
    rounds = ()  # nor has it rounds before it
    stats = ()

    @property
    def key(self) -> str:
        return pool_key(self.problem.key)

    def sampling(self, cfg: RunConfig) -> tuple[int, int]:
        return cfg.pool, pool_seed(cfg.seed, self.problem.key)

    def left(self, cfg: RunConfig) -> tuple[int, int]:
        return planned(cfg, len(self.runs))
