"""The bandwidth floor of a rehearsal's trajectories: the bytes no engine can avoid reading to generate them.

Per target step (a plain decode step, or a verify step and its prefill chunks): the weights once, each decode
row's context KV once (its queries' stores too), a prompt its request's rows share once for them, and each new
prompt token's KV stored once (a recomputed one not at all). Draft steps are not counted: this is the floor of
a perfect speculative schedule at the acceptance the run had, whose drafts cost nothing and whose verify steps
are the run's (the same tokens per verify step). The gap between a row and its floor is then the schedule
(preemption, recompute, cascade misses, batching), the overheads (launches, sampling) and, with speculation,
the cost of drafting.

The floor is priced two ways (``seconds``): at the device's copy bandwidth (what no kernel beats) and at its
modelled efficiencies (the weights at ``linear_bw_eff``, the KV at ``attention_bw_eff``: what this device model
could reach with a perfect schedule). Its figures are recorded per account (a PaCoRe round) in the ledger
(engine/rehearsal/runner.py) and written in each rehearsal's report (bench/rehearsal).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.device_model import DeviceParams, ModelShape


@dataclass(slots=True)
class FloorBytes:
    """Bytes the floor reads: ``weights`` (once per target step) and ``kv`` (reads and stores of KV)."""

    weights: float = 0.0
    kv: float = 0.0

    def add(self, other: "FloorBytes") -> None:
        self.weights += other.weights
        self.kv += other.kv

    def seconds(self, dev: DeviceParams, efficiencies: bool) -> float:
        """Their time at the copy bandwidth, or (``efficiencies``) at the modelled weight-streaming and
        paged-decode fractions of it."""
        bw = dev.hbm_bytes_per_s
        if not efficiencies:
            return (self.weights + self.kv) / bw
        return self.weights / (bw * dev.linear_bw_eff) + self.kv / (bw * dev.attention_bw_eff)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv}


@dataclass(slots=True)
class RequestRows:
    """One request's decode rows in a step: each row's context before the step, its queries (1, or a verify
    row's last token and its drafts), and the tokens of the prompt its rows hold in common."""

    key: object
    contexts: list[int]
    queries: list[int]
    shared: int = 0


def step_floor(rows: list[RequestRows], prefill: list[tuple[object, int]],
               shape: ModelShape) -> dict[object, FloorBytes]:
    """The floor's bytes of one target step by account: ``rows`` by request, ``prefill`` as (account, new
    prompt tokens). The weights are shared out by the step's tokens (as engine/device_model.py shares time)."""
    kvpt = shape.kv_bytes_per_token
    tokens: dict[object, int] = {}
    out: dict[object, FloorBytes] = {}
    for r in rows:
        n = len(r.contexts)
        read = sum(r.contexts) + sum(r.queries) - (n - 1) * min(r.shared, min(r.contexts))
        out.setdefault(r.key, FloorBytes()).kv += (read + sum(r.queries)) * kvpt  # reads, then the stores
        tokens[r.key] = tokens.get(r.key, 0) + sum(r.queries)
    for key, new in prefill:
        out.setdefault(key, FloorBytes()).kv += new * kvpt
        tokens[key] = tokens.get(key, 0) + new
    total = sum(tokens.values())
    for key, f in out.items():
        f.weights = shape.weight_bytes * tokens[key] / total if total else 0.0
    return out
