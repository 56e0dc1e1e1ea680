"""Per-round statistics of a problem and the run summary built from the results file."""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from .config import RunConfig
from .io import latest_records, read_results, write_json


@dataclass(slots=True)
class RoundStats:
    """What one round (one engine request with n=K) of one problem cost and produced."""

    round: int  # 1-based
    k: int
    prompt_tokens: int
    generated_tokens: int
    prefill_time_s: float  # first token - arrival: queueing + prefill
    decode_time_s: float  # finished - first token
    tokens_per_s: float  # generated tokens / (prefill + decode time) of this request
    prefix_cache_hit_tokens: int
    kv_blocks_saved_by_sharing: int
    references: int  # reference messages in this round's prompt
    dropped_messages: int  # previous-round messages dropped because they were empty
    truncated_messages: int  # references shortened to fit the context
    truncated_tokens: int = 0  # tokens those references lost
    finish_reasons: dict[str, int] = field(default_factory=dict)
    answers: list[str | None] = field(default_factory=list)
    accuracy: float | None = None  # mean correctness over the K trajectories

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def round_stats_from_output(round_no: int, k: int, out, *, references: int, dropped: int, truncated: int,
                            truncated_tokens: int = 0, resumed: int = 0) -> RoundStats:
    """RoundStats from an engine RequestOutput; ``resumed`` tokens came from an earlier session's snapshot
    (counted as generated, but not in this session's tokens/s)."""
    m = out.metrics
    generated = sum(len(c.token_ids) for c in out.outputs)
    first = m.first_token_time if m.first_token_time is not None else m.finished_time
    prefill = max(0.0, first - m.arrival_time)
    decode = max(0.0, m.finished_time - first)
    total = prefill + decode
    return RoundStats(
        round=round_no,
        k=k,
        prompt_tokens=len(out.prompt_token_ids),
        generated_tokens=generated,
        prefill_time_s=round(prefill, 6),
        decode_time_s=round(decode, 6),
        tokens_per_s=round((generated - resumed) / total, 3) if total > 0 else 0.0,
        prefix_cache_hit_tokens=int(out.num_cached_tokens or 0),
        kv_blocks_saved_by_sharing=int(getattr(m, "kv_blocks_saved_by_sharing", 0) or 0),
        references=references,
        dropped_messages=dropped,
        truncated_messages=truncated,
        truncated_tokens=truncated_tokens,
        finish_reasons=dict(Counter(c.finish_reason for c in out.outputs)),
    )


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(records: list[dict], schedule: list[int]) -> dict:
    """Aggregate the results file: accuracy per round vs self-consistency, tokens/s, compute, KV saved.

    Each problem counts once (``latest_records``), however many sessions wrote records for it.
    """
    records = latest_records(records)
    ok = [r for r in records if "error" not in r]
    errors = [r for r in records if "error" in r]
    graded = [r for r in ok if r.get("correct") is not None]
    rounds = []
    for i, k in enumerate(schedule):
        rs = [r["rounds_stats"][i] for r in ok if len(r.get("rounds_stats", [])) > i]
        accs = [s["accuracy"] for s in rs if s.get("accuracy") is not None]
        rounds.append({
            "round": i + 1,
            "k": k,
            "problems": len(rs),
            "accuracy": _mean(accs),
            "prompt_tokens": sum(s["prompt_tokens"] for s in rs),
            "generated_tokens": sum(s["generated_tokens"] for s in rs),
            "mean_tokens_per_s": _mean([s["tokens_per_s"] for s in rs]),
            "mean_prefill_time_s": _mean([s["prefill_time_s"] for s in rs]),
            "mean_decode_time_s": _mean([s["decode_time_s"] for s in rs]),
            "prefix_cache_hit_tokens": sum(s["prefix_cache_hit_tokens"] for s in rs),
            "kv_blocks_saved_by_sharing": sum(s["kv_blocks_saved_by_sharing"] for s in rs),
            "dropped_messages": sum(s["dropped_messages"] for s in rs),
            "truncated_messages": sum(s["truncated_messages"] for s in rs),
            "truncated_tokens": sum(s.get("truncated_tokens", 0) for s in rs),
        })
    sc = [r["self_consistency"]["correct"] for r in ok if (r.get("self_consistency") or {}).get("correct") is not None]
    compute = [r["effective_compute_tokens"] for r in ok if "effective_compute_tokens" in r]
    return {
        "problems": len(records),
        "completed": len(ok),
        "errors": len(errors),
        "graded": len(graded),
        "accuracy": _mean([float(r["correct"]) for r in graded]),
        "self_consistency_accuracy": _mean([float(c) for c in sc]),
        "self_consistency_k": schedule[0] if schedule else None,
        "rounds": rounds,
        "effective_compute_tokens_total": sum(compute),
        "effective_compute_tokens_mean": _mean(compute),
        "kv_blocks_saved_by_sharing": sum(x["kv_blocks_saved_by_sharing"] for x in rounds),
        "error_samples": [{"request_id": r.get("request_id"), "error": r["error"]} for r in errors[:10]],
    }


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.1f}"


def format_summary(summary: dict) -> str:
    """A human-readable summary for the terminal."""
    lines = [
        f"PaCoRe run: {summary['completed']}/{summary['problems']} problems completed, "
        f"{summary['errors']} errors, {summary['graded']} graded",
        f"  accuracy (final answer): {_fmt(summary['accuracy'], True)}   "
        f"self-consistency (majority of {summary['self_consistency_k']} round-1 answers): "
        f"{_fmt(summary['self_consistency_accuracy'], True)}",
        f"  {'round':>5} {'K':>4} {'acc':>7} {'prompt tok':>11} {'gen tok':>9} {'tok/s':>8} "
        f"{'cache hit':>10} {'KV saved':>9} {'dropped':>8} {'cut (tokens)':>14}",
    ]
    for r in summary["rounds"]:
        cut = f"{r['truncated_messages']} ({r['truncated_tokens']})"
        lines.append(
            f"  {r['round']:>5} {r['k']:>4} {_fmt(r['accuracy'], True):>7} {r['prompt_tokens']:>11} "
            f"{r['generated_tokens']:>9} {_fmt(r['mean_tokens_per_s']):>8} {r['prefix_cache_hit_tokens']:>10} "
            f"{r['kv_blocks_saved_by_sharing']:>9} {r['dropped_messages']:>8} "
            f"{cut:>14}"
        )
    lines.append(
        f"  effective test-time compute: {summary['effective_compute_tokens_total']} tokens "
        f"({_fmt(summary['effective_compute_tokens_mean'])} per problem); "
        f"KV blocks saved by sharing: {summary['kv_blocks_saved_by_sharing']}"
    )
    run = summary.get("run")
    if run:
        lines.append(
            f"  this session: {run['generated_tokens']} tokens in {run['wall_time_s']:.1f}s "
            f"= {run['tokens_per_s']:.1f} tok/s"
            + (f" on {len(run['replicas'])} replicas" if run.get("replicas") else "")
        )
    for e in summary["error_samples"]:
        lines.append(f"  error [{e['request_id']}]: {e['error']}")
    return "\n".join(lines)


def write_summary(cfg: RunConfig, wall: float, sessions: list[dict]) -> dict:
    """Summarize the whole results file plus this session's engines (one per replica); write it."""
    summary = summarize(read_results(cfg.out_path), list(cfg.schedule))
    tokens = sum(s["generated_tokens"] for s in sessions)
    first = sessions[0] if sessions else {"max_tokens": cfg.max_tokens, "max_model_len": None, "engine_stats": {}}
    summary["run"] = {
        "wall_time_s": round(wall, 3),
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 3) if wall > 0 else 0.0,
        "max_tokens": first["max_tokens"],
        "max_model_len": first["max_model_len"],
        "engine_stats": first["engine_stats"] if len(sessions) <= 1 else _sum_stats(sessions),
    }
    if len(sessions) > 1:
        summary["run"]["replicas"] = sessions
    summary["config"] = cfg.to_dict()
    write_json(summary_path(cfg.out_path), summary)
    return summary


def _sum_stats(sessions: list[dict]) -> dict:
    """Engine counters added up over replicas (block size in bytes is the same for all)."""
    total: dict = {}
    for s in sessions:
        for key, value in s["engine_stats"].items():
            if isinstance(value, (int, float)) and key != "kv_bytes_per_block":
                total[key] = total.get(key, 0) + value
            else:
                total.setdefault(key, value)
    return total


def summary_path(out_path: str) -> str:
    """Where the run summary of ``out_path`` is written."""
    return f"{out_path}.summary.json"


def show_summary(summary: dict, cfg: RunConfig) -> None:
    """Print the summary and where the results are."""
    print(format_summary(summary))
    print(f"results: {cfg.out_path}\nsummary: {summary_path(cfg.out_path)}")
