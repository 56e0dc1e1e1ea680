"""What a rehearsal reports: per round, tokens/s and where the modelled time went, beside the floor.

A step serves several rounds at once (problems advance independently), so each round's share of a
step (engine/device_model.py) is added to that round's account.
"""
from __future__ import annotations

from engine.device_model import PARTS, StepCost
from engine.rehearsal.floor import FloorBytes


def by_round(ledger) -> dict[int, dict]:
    """{round: {tokens, seconds, tokens_per_s, limit_tokens_per_s, draft_seconds, parts: {part: seconds},
    floor_bytes: {weights, kv}}}, from a ledger whose accounts are rounds (RehearsalRunner.account_by)."""
    return {r: _figures(ledger.by_account[r], ledger.generated.get(r, 0), _seconds(ledger.drafts.get(r)),
                        ledger.floor.get(r, FloorBytes())) for r in sorted(ledger.by_account)}


def overall(ledger) -> dict:
    floor = FloorBytes()
    for f in ledger.floor.values():
        floor.add(f)
    return _figures(ledger.total, sum(ledger.generated.values()), sum(c.total for c in ledger.drafts.values()), floor)


def parts(cost: StepCost) -> dict:
    return {p: getattr(cost, p) for p in PARTS}


def _seconds(cost: StepCost | None) -> float:
    return cost.total if cost is not None else 0.0


def _figures(cost: StepCost, tokens: int, draft_seconds: float = 0.0, floor: FloorBytes | None = None) -> dict:
    """draft_seconds: the share of the seconds self-drafting's draft steps took (in the parts too); floor: the
    bandwidth floor's bytes (engine/rehearsal/floor.py)."""
    return {"tokens": tokens, "seconds": cost.total, "limit_seconds": cost.limit,
            "tokens_per_s": tokens / cost.total if cost.total else 0.0,
            "limit_tokens_per_s": tokens / cost.limit if cost.limit else 0.0,
            "draft_seconds": draft_seconds, "parts": parts(cost),
            "floor_bytes": (floor or FloorBytes()).to_dict()}


def markdown_table(results: dict[str, dict]) -> str:
    """One row per (configuration, round): tokens/s, the floor's tokens/s, and the time split."""
    head = ["config", "round", "tokens", "virtual s", "tok/s", "limit tok/s", *PARTS, "draft steps", "preempt",
            "recompute %", "cascade steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, res in results.items():
        rows = [(str(r), f) for r, f in res["rounds"].items()] + [("all", res["overall"])]
        for r, f in rows:
            parts = [f"{100 * f['parts'][p] / f['seconds']:.0f}%" if f["seconds"] else "-" for p in PARTS]
            parts.append(f"{100 * f['draft_seconds'] / f['seconds']:.0f}%" if f["draft_seconds"] else "")
            tail = ([str(res["preemptions"]), f"{100 * res['recompute_fraction']:.1f}", str(res["cascade_steps"])]
                    if r == "all" else ["", "", ""])
            lines.append("| " + " | ".join([name, r, f"{f['tokens']:,}", f"{f['seconds']:.1f}", f"{f['tokens_per_s']:,.0f}",
                                            f"{f['limit_tokens_per_s']:,.0f}", *parts, *tail]) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict], path: str) -> None:
    """Tokens/s per configuration beside its floor, and KV occupancy over virtual time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(results)
    xs = range(len(names))
    ax1.bar([x - 0.2 for x in xs], [results[n]["overall"]["tokens_per_s"] for n in names], 0.4, label="modelled")
    ax1.bar([x + 0.2 for x in xs], [results[n]["overall"]["limit_tokens_per_s"] for n in names], 0.4,
            label="floor: bytes needed / bandwidth")
    ax1.set_xticks(list(xs), names, rotation=15)
    ax1.set_ylabel("generated tokens / virtual s")
    ax1.legend()
    for n in names:
        t, used = zip(*results[n]["occupancy"]) if results[n]["occupancy"] else ((), ())
        ax2.plot(t, [u / results[n]["num_blocks"] for u in used], label=n)
    ax2.set_xlabel("virtual s")
    ax2.set_ylabel("KV blocks in use / cache")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
