"""Trajectory lengths for a rehearsal: drawn to match the paper's token totals, or replayed.

The paper (arXiv 2601.05593) spends about 0.24M / 0.87M / 1.8M tokens per problem at low / medium /
high, over 5 / 17 / 37 trajectories (K = [4], [16], [32, 4], then the final K = 1): ~48-51k tokens
each. ``PaperLengths`` draws each trajectory's length from a log-normal whose mean, once capped by
the room the context leaves, gives those totals; its conclusion (the text after ``</think>``, what
the next round's prompt holds) from a log-normal with a median of ``conclusion_median`` tokens, so a
round-2 prompt of 32 references is ~50k tokens. ``ReplayLengths`` gives each trajectory the token
count a results file recorded for it, and its conclusion the tokens of its recorded message.
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

from engine.rehearsal.runner import END_THINK

PAPER_TOKENS_PER_PROBLEM = {"low": 0.24e6, "medium": 0.87e6, "high": 1.8e6}
CONTEXT = 131072


def mean_trajectory_tokens(preset: str, rounds: tuple[int, ...]) -> float:
    return PAPER_TOKENS_PER_PROBLEM[preset] / (sum(rounds) + 1)


def _capped_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X log-normal(mu, sigma)."""
    z = (math.log(cap) - mu) / sigma
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    return math.exp(mu + sigma * sigma / 2) * phi(z - sigma) + cap * (1 - phi(z))


def solve_mu(mean: float, sigma: float, cap: float) -> float:
    """The log-normal location whose capped mean is ``mean`` (bisection; the capped mean grows with mu)."""
    if mean >= cap:
        raise ValueError(f"a mean of {mean:.0f} tokens cannot fit under a cap of {cap:.0f}")
    lo, hi = 0.0, math.log(cap) + 10 * sigma
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _capped_mean(mid, sigma, cap) < mean else (lo, mid)
    return (lo + hi) / 2


class PaperLengths:
    """Seeded draws per (request id, child index): the same lengths whatever the scheduling order."""

    def __init__(self, mean_tokens: float, seed: int = 0, sigma: float = 0.6, conclusion_median: float = 1500,
                 conclusion_sigma: float = 0.4, context: int = CONTEXT):
        self.mean, self.seed, self.sigma = mean_tokens, seed, sigma
        self.conclusion_median, self.conclusion_sigma = conclusion_median, conclusion_sigma
        self.mu = solve_mu(mean_tokens, sigma, context)

    def lengths(self, request_id: str, index: int, prompt_tokens: int, max_tokens: int) -> tuple[int, int]:
        rng = random.Random(f"{self.seed}/{request_id}/{index}")
        total = int(rng.lognormvariate(self.mu, self.sigma))
        conclusion = int(rng.lognormvariate(math.log(self.conclusion_median), self.conclusion_sigma))
        total = max(2, total)
        return total, min(conclusion, total // 2)


class ReplayLengths:
    """Lengths from a results file: ``key(request_id, index)`` names the (problem, run, round, index)
    whose recorded trajectory a rehearsal request stands for. Every entry is checked as it is read:
    ValueError names the line, the round, the trajectory and what is wrong with it. ``problems``: each
    problem whose run 0 the file recorded in full (no error), in file order, with the K of its rounds."""

    def __init__(self, results: str | Path, tokenizer, key: Callable[[str, int], tuple]):
        self.key = key
        self.table: dict[tuple, tuple[int, int]] = {}
        self.problems: dict[str, tuple[int, ...]] = {}
        try:
            lines = Path(results).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--replay {results}: cannot be read ({e})") from None
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"--replay {results} line {n}"
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                raise ValueError(f"{where}: not a JSON record (a torn or corrupted line); remove it") from None
            if not isinstance(rec, dict) or "round_responses" not in rec:
                continue  # input error records
            for (pid, run, r, index), t in _entries(rec, where):
                message = t.get("content", "").rsplit(END_THINK, 1)[-1]
                conclusion = len(tokenizer.encode(message, add_special_tokens=False)) if message else 0
                # a trajectory cut at its length limit ran on: give it one token more than it had
                self.table[(pid, run, r, index)] = (t["tokens"] + (t.get("finish_reason") == "length"), conclusion)
            if rec.get("run", 0) == 0 and "error" not in rec:
                self.problems[str(rec["request_id"])] = tuple(len(rnd) for rnd in rec["round_responses"])

    def lengths(self, request_id: str, index: int, prompt_tokens: int, max_tokens: int) -> tuple[int, int]:
        k = self.key(request_id, index)
        if k not in self.table:
            raise KeyError(f"the results file has no trajectory for {k}: replay the problems it recorded")
        return self.table[k]


def _entries(rec: dict, where: str):
    """((problem, run, round, index), trajectory) of a results record, each checked."""
    pid, run, rounds = rec.get("request_id"), rec.get("run", 0), rec["round_responses"]
    if not isinstance(pid, (str, int)) or isinstance(pid, bool):
        raise ValueError(f"{where}: request_id must be a string or an integer, got {pid!r}")
    if not _count(run):
        raise ValueError(f"{where}: run must be an integer >= 0, got {run!r}")
    if not isinstance(rounds, list) or not all(isinstance(rnd, list) for rnd in rounds):
        raise ValueError(f"{where}: round_responses must be a list of rounds, each a list of trajectories")
    for r, rnd in enumerate(rounds, start=1):
        seen = set()
        for j, t in enumerate(rnd):
            at = f"{where}: round {r} trajectory {j}"
            if not isinstance(t, dict):
                raise ValueError(f"{at}: expected an object, got {t!r:.40}")
            for name in ("tokens", "index"):
                if not _count(t.get(name)):
                    raise ValueError(f"{at}: {name!r} must be an integer >= 0, got {t.get(name)!r:.40}")
            if not isinstance(t.get("content", ""), str) or not isinstance(t.get("finish_reason"), (str, type(None))):
                raise ValueError(f"{at}: 'content' must be a string and 'finish_reason' a string or null")
            if t["index"] in seen:
                raise ValueError(f"{at}: index {t['index']} twice in the round")
            seen.add(t["index"])
            yield (str(pid), run, r, t["index"]), t


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _parts(request_id: str) -> tuple[str, object, int]:
    """(problem key, run, round) of a PaCoRe round's request id."""
    from pacore.results.keys import parse_request_id
    k = parse_request_id(request_id)
    return k.problem_id, k.run, k.round


def round_of(request_id: str) -> int:
    return _parts(request_id)[2]


def replay_key(request_id: str, index: int) -> tuple:
    return (*_parts(request_id), index)
