"""The protocol a rehearsal answers for: problems x runs (a round-1 pool) on N GPUs, and its sample.

``pacore run --runs R --pool M --data-parallel N`` runs every problem R times, round 1 drawn from a
pool of M trajectories per problem, on N independent engines that split the problems between them
(pacore/replicas/driver.py: each takes at most its fair share, so the slowest holds ceil(P / N)). The
paper's HMMT protocol at "high" (30 problems, --runs 64 --pool 512) is ~1.2B tokens: too many to
rehearse token by token on a CPU. So a rehearsal runs a sample of the slowest replica's work: its
first ``problems`` problems, each with ``runs`` of the R runs and a pool scaled by the same fraction
(at least twice round 1's K), and extrapolates each round on its own: the full protocol's tokens of that
round (its trajectories x the rehearsed mean length) over the rehearsed round's tokens per second.
docs/rehearsal.md shows the shortcut against full rehearsals of the sizes a CPU can run. Beside each row's
hours, the bandwidth floor of the same trajectories (engine/rehearsal/floor.py), extrapolated alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.device_model import DeviceParams
from engine.rehearsal.floor import FloorBytes

from bench.rehearsal.checks import Refused


@dataclass(slots=True, frozen=True)
class Protocol:
    """``problems`` x ``runs`` (round 1 from a ``pool`` per problem, or None) of ``schedule`` (each
    round's K, the final 1 included) on ``gpus`` data-parallel replicas; ``sample``: (problems, runs)
    of the slowest replica rehearsed."""

    problems: int
    runs: int
    pool: int | None
    gpus: int
    schedule: tuple[int, ...]
    sample: tuple[int, int]

    @property
    def per_gpu(self) -> int:
        """Problems of the slowest replica."""
        return -(-self.problems // self.gpus)

    @property
    def sample_pool(self) -> int | None:
        """The rehearsed pool: the pool scaled as the runs are, at least twice round 1's K (at most the
        whole pool). Each run draws its K sorted (pacore/evaluate/runs.py), so from a pool of K every
        sampled run would take the same references in the same order: identical round-2 prompts,
        sharing their KV and, under a cascade over the whole step, their reads, where the protocol's
        runs (K of 512) each draw their own."""
        if self.pool is None:
            return None
        return min(self.pool, max(2 * self.schedule[0], math.ceil(self.pool * self.sample[1] / self.runs)))

    @property
    def is_sample(self) -> bool:
        return self.sample != (self.per_gpu, self.runs)

    def trajectories(self, problems: int, runs: int, pool: int | None) -> dict[int, int]:
        """{round: trajectories generated} for ``problems`` x ``runs`` with ``pool``."""
        out = {r: problems * runs * k for r, k in enumerate(self.schedule, start=1)}
        if pool is not None:
            out[1] = problems * pool
        return out

    def full(self) -> dict[int, int]:
        """The slowest replica's trajectories per round."""
        return self.trajectories(self.per_gpu, self.runs, self.pool)

    def rehearsed(self) -> dict[int, int]:
        return self.trajectories(*self.sample, self.sample_pool)

    def describe(self) -> str:
        pool = f", round 1 from a pool of {self.pool} per problem" if self.pool else ""
        head = (f"{_n(self.problems, 'problem')} x {_n(self.runs, 'run')}{pool}, K={list(self.schedule)}, on "
                f"{_n(self.gpus, 'GPU')}: the slowest replica runs {_n(self.per_gpu, 'problem')}")
        if not self.is_sample:
            return head + ", rehearsed in full"
        pool = f", pool {self.sample_pool}" if self.pool else ""
        return (head + f"; rehearsed: {_n(self.sample[0], 'problem')} x {_n(self.sample[1], 'run')}{pool}, each round "
                       f"extrapolated")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def protocol_of(args, schedule: tuple[int, ...]) -> Protocol:
    """The protocol the flags name, refused (naming the fix) when it cannot run as ``pacore run``
    would run it, and the sample to rehearse (--sample-problems / --sample-runs; by default at most 8
    runs, and every problem of the slowest replica unless the runs are sampled, then its first two).

    Two problems, not one: with one, every row of round 1 holds the same prompt, so a cascade over a
    prefix the whole step shares (vLLM's) finds it, where the replica's problems running together give
    it none; the one-problem sample put vllm-fp8 1.05x ahead of fp8 where the full rehearsal puts fp8
    1.16x ahead (docs/rehearsal.md, "Its error")."""
    problems = args.problems or 8
    k1 = schedule[0]
    if args.pool is not None and args.pool < k1:
        raise Refused(f"--pool {args.pool} is smaller than round 1's K={k1}: each run draws {k1} trajectories "
                      f"from the pool without replacement; use --pool {k1} or more")
    if args.replay and (args.runs > 1 or args.pool is not None or args.gpus > 1):
        raise Refused("--replay rehearses the run 0 a results file recorded, on one GPU: leave out --runs, --pool "
                      "and --gpus (or rehearse the protocol without --replay)")
    if args.gpus > problems:
        raise Refused(f"--gpus {args.gpus} is more than the {problems} problems: each replica runs whole problems, "
                      f"so {args.gpus - problems} would idle; use --gpus {problems} or more --problems")
    per_gpu = -(-problems // args.gpus)
    r = args.sample_runs or min(args.runs, 8)
    q = args.sample_problems or (per_gpu if r == args.runs else min(per_gpu, 2))
    if q > per_gpu:
        raise Refused(f"--sample-problems {q} is more than the {per_gpu} problems the slowest of {args.gpus} GPUs "
                      f"runs ({problems} problems); use --sample-problems {per_gpu} or fewer")
    if r > args.runs:
        raise Refused(f"--sample-runs {r} is more than --runs {args.runs}; use --sample-runs {args.runs} or fewer")
    return Protocol(problems, args.runs, args.pool, args.gpus, (*schedule, 1), (q, r))


def extrapolate(proto: Protocol, res: dict, device: DeviceParams | None = None) -> dict:
    """The slowest replica's hours for the whole protocol from a rehearsal's report: per round, the
    full protocol's tokens (its trajectories x the rehearsed mean length) at the rehearsed tokens/s. With
    ``device``, the floor's hours too ("floor_hours": at the copy bandwidth and at the modelled efficiencies),
    each round's floor at the rehearsed round's tokens per floor second; None for a report without the floor's
    bytes (one written before they were recorded)."""
    full, done = proto.full(), proto.rehearsed()
    rounds, seconds, tokens = {}, 0.0, 0.0
    floor: dict | None = {"copy": 0.0, "modelled": 0.0} if device else None
    for r, n in full.items():
        f = res["rounds"].get(str(r))
        if not f or not f["tokens_per_s"]:
            raise Refused(f"round {r} generated nothing in the rehearsal: nothing to extrapolate it from")
        t = n * f["tokens"] / done[r]
        rounds[r] = {"tokens": t, "tokens_per_s": f["tokens_per_s"], "seconds": t / f["tokens_per_s"]}
        seconds += rounds[r]["seconds"]
        tokens += t
        if floor is not None and "floor_bytes" in f:
            fb = FloorBytes(**f["floor_bytes"])
            for kind in floor:
                floor[kind] += fb.seconds(device, kind == "modelled") * t / f["tokens"] / 3600
        else:
            floor = None
    return {"rounds": rounds, "tokens_per_gpu": tokens, "seconds": seconds, "hours": seconds / 3600,
            "tokens": tokens * proto.problems / proto.per_gpu, "tokens_per_s": tokens / seconds, "floor_hours": floor}


ASSUMES = ("modelled, not measured: the device model's figures (engine/device_model.py, or --device); each GPU "
           "an independent engine (data parallel, as pacore run --data-parallel), the slowest holding ceil(problems "
           "/ GPUs) problems; no model loading, compilation or host stalls; trajectory lengths drawn to the paper's "
           "mean per preset")


FLOOR = ("the bandwidth floor of the same trajectories (engine/rehearsal/floor.py): per target step the weights once, "
         "each row's context KV once and a prompt its request's rows share once, new prompt tokens stored once; "
         "speculation at the run's acceptance with drafts free (its verify steps as they ran); at the copy "
         "bandwidth, and at the modelled weight-streaming and paged-decode efficiencies")


def table(proto: Protocol, results: dict[str, dict]) -> str:
    """Per configuration: tokens/s per round and whole, and the hours of the protocol on its GPUs."""
    n = len(proto.schedule)
    head = ["config", *[f"round {r} tok/s" for r in range(1, n + 1)], "whole tok/s", "tokens per GPU",
            f"hours on {proto.gpus} GPU{'s' if proto.gpus > 1 else ''}", "floor h: copy bw / modelled eff.",
            "x floor: copy bw / modelled eff."]
    lines = [f"protocol: {proto.describe()}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, res in results.items():
        e = res["protocol"]
        cells = [f"{e['rounds'][r]['tokens_per_s']:,.0f}" for r in range(1, n + 1)]
        fl = e.get("floor_hours")
        floor = ([f"{fl['copy']:,.2f} / {fl['modelled']:,.2f}", f"{e['hours'] / fl['copy']:.2f}x / "
                  f"{e['hours'] / fl['modelled']:.2f}x"] if fl else ["not recorded", "-"])
        lines.append("| " + " | ".join([name, *cells, f"{e['tokens_per_s']:,.0f}", f"{e['tokens_per_gpu'] / 1e6:,.1f}M",
                                        f"{e['hours']:,.2f}", *floor]) + " |")
    return "\n".join(lines + ["", f"floor: {FLOOR}", "", f"assumes: {ASSUMES}"])
