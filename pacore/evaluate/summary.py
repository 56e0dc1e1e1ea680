"""The run summary, built from the whole results file: accuracy per round and over runs, compute, KV saved."""
from __future__ import annotations

import statistics

from ..config import RunConfig
from ..results.files import read_results, summary_path, write_json
from ..results import problem_set
from ..results.resume import latest_records
from ..results.settings import read_problem_set
from ..results.shapes import trajectory, usable_result
from .confidence import MEASURES, confidence_vs_correctness
from .grading import ungradable
from .stats import SPEC_DECODE_COUNTS, spec_decode_ratios


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _over_runs(records: list[dict], value) -> tuple[float | None, float | None]:
    """The mean of ``value(record)`` over all records (pass@1 averaged over problems and runs, as the
    paper reports it) and the standard deviation, over runs, of each run's mean (None with one run)."""
    per_run: dict = {}
    for rec in records:
        v = value(rec)
        if v is not None:
            per_run.setdefault(rec.get("run", 0), []).append(float(v))
    values = [v for vs in per_run.values() for v in vs]
    means = [sum(vs) / len(vs) for vs in per_run.values()]
    return _mean(values), statistics.stdev(means) if len(means) > 1 else None


def _problem_of(rec: dict) -> tuple:
    return ("line", rec.get("line")) if rec.get("input_error") else ("id", str(rec.get("request_id")))


def _round_confidence(records: list[dict], i: int) -> dict:
    """Round ``i``'s confidence against correctness over its graded trajectories that have the measures
    (--record-confidence: rounds_stats' ``correct`` lines up with round_responses), and ``measured`` of
    its ``trajectories``: how many had the measures at all (fewer when sessions with and without
    --record-confidence wrote the results)."""
    pairs, total, measured = [], 0, 0
    for rec in records:
        responses, correct = rec.get("round_responses"), rec["rounds_stats"][i].get("correct")
        if not (isinstance(responses, list) and len(responses) > i and isinstance(responses[i], list)):
            continue
        total += len(responses[i])
        has = [isinstance(t, dict) and any(m in t for m in MEASURES) for t in responses[i]]
        measured += sum(has)
        if not (isinstance(correct, list) and len(correct) == len(responses[i])):
            continue
        pairs += [(t, ok) for j, (t, ok) in enumerate(zip(responses[i], correct))
                  if ok is not None and has[j] and trajectory(t, j) is not None]
    return {**confidence_vs_correctness(pairs), "measured": measured, "trajectories": total}


def summarize(records: list[dict], schedule: list[int], problems: dict[str, str] | None = None) -> dict:
    """Aggregate the results file: accuracy per round vs self-consistency (mean and std over runs),
    tokens/s, compute, KV saved, and with --record-confidence how confidence relates to correctness.

    Each run of a problem counts once (``latest_records``), however many sessions wrote records for it;
    a record not of the shape of a result (shapes.py; resume warns of them) is left out, and so is, given
    the problem set the results answer (``problems``, from the settings file), a record of a problem not in
    it: those problems are named under "left_out".
    """
    records = latest_records([r for r in records if usable_result(r)])
    left_out = problem_set.outside(records, problems) if problems is not None else []
    if left_out:
        records = [r for r in records if r.get("input_error") or str(r.get("request_id")) in problems]
    ok = [r for r in records if "error" not in r]
    errors = [r for r in records if "error" in r]
    graded = [r for r in ok if r.get("correct") is not None]
    rounds, confidences = [], []
    for i, k in enumerate(schedule):
        has = [r for r in ok if len(r.get("rounds_stats", [])) > i]
        rs = [r["rounds_stats"][i] for r in has]
        accuracy, accuracy_std = _over_runs(has, lambda r: r["rounds_stats"][i].get("accuracy"))
        rounds.append({
            "round": i + 1,
            "k": k,
            "problems": len(rs),
            "accuracy": accuracy,
            "accuracy_std": accuracy_std,
            "prompt_tokens": sum(s["prompt_tokens"] for s in rs),
            "generated_tokens": sum(s["generated_tokens"] for s in rs),
            "mean_tokens_per_s": _mean([s["tokens_per_s"] for s in rs]),  # each problem's own rate, averaged
            "mean_prefill_time_s": _mean([s["prefill_time_s"] for s in rs]),
            "mean_decode_time_s": _mean([s["decode_time_s"] for s in rs]),
            "prefix_cache_hit_tokens": sum(s["prefix_cache_hit_tokens"] for s in rs),
            "kv_blocks_saved_by_sharing": sum(s["kv_blocks_saved_by_sharing"] for s in rs),
            "dropped_messages": sum(s["dropped_messages"] for s in rs),
            "truncated_messages": sum(s["truncated_messages"] for s in rs),
            "truncated_tokens": sum(s.get("truncated_tokens", 0) for s in rs),
        })
        confidences.append(_round_confidence(has, i))
    if any(c["correct"] or c["incorrect"] for c in confidences):  # graded trajectories with the measures
        for r, c in zip(rounds, confidences):
            r["confidence"] = c
    accuracy, accuracy_std = _over_runs(graded, lambda r: r["correct"])
    sc, sc_std = _over_runs(ok, lambda r: (r.get("self_consistency") or {}).get("correct"))
    compute = [r["effective_compute_tokens"] for r in ok if "effective_compute_tokens" in r]
    # A pool's trajectories were generated once per problem, however many runs drew from them.
    pools = {str(r["request_id"]): r["pool"] for r in ok if r.get("pool")}
    generated = sum(s["generated_tokens"] for r in ok for s in r.get("rounds_stats", []) if not s.get("pool"))
    generated += sum(p["generated_tokens"] for p in pools.values())
    saved = sum(x["kv_blocks_saved_by_sharing"] for x in rounds)
    saved += sum(p["stats"]["kv_blocks_saved_by_sharing"] for p in pools.values())
    for i, row in enumerate(rounds):  # a pool's verify work once, in round 1, as its tokens
        row.update(_spec_decode([r["rounds_stats"][i] for r in ok if len(r.get("rounds_stats", [])) > i]
                                + ([p["stats"] for p in pools.values()] if i == 0 else [])))
        # the engine's work for the round: a run's round 1 drawn from a pool was generated by the pool
        work = [r["rounds_stats"][i] for r in ok if len(r.get("rounds_stats", [])) > i
                and not r["rounds_stats"][i].get("pool")] + ([p["stats"] for p in pools.values()] if i == 0 else [])
        row["tokens_per_s"], row["wall_time_s"] = round_throughput(work)
    return {
        "problems": len({_problem_of(r) for r in records}),
        "runs": max((r.get("run", 0) for r in ok), default=0) + 1,
        "completed": len(ok),
        "errors": len(errors),
        "graded": len(graded),
        "accuracy": accuracy,
        "accuracy_std": accuracy_std,
        "self_consistency_accuracy": sc,
        "self_consistency_accuracy_std": sc_std,
        "self_consistency_k": schedule[0] if schedule else None,
        "rounds": rounds,
        "effective_compute_tokens_total": sum(compute),
        "effective_compute_tokens_mean": _mean(compute),
        "generated_tokens_total": generated,
        "pool_generated_tokens": sum(p["generated_tokens"] for p in pools.values()),
        # per request: the prompt blocks its fork shared instead of copying; summed, not a peak
        "kv_blocks_saved_by_sharing_sum": saved,
        "error_samples": [{"request_id": r.get("request_id"), "run": r.get("run"), "error": r["error"]}
                          for r in errors[:10]],
        "ungraded": _ungraded(ok),
        "left_out": {"problems": len(left_out), "ids": left_out[:10]},
    }


def _ungraded(ok: list[dict]) -> list[dict]:
    """Each problem that finished ungraded, once, with why (a record carries its input's ground_truth)."""
    named: dict[str, dict] = {}
    for r in ok:
        why = ungradable(r) if r.get("correct") is None else None
        if why is not None:
            named.setdefault(str(r["request_id"]), {"request_id": r["request_id"], "why": why})
    return list(named.values())


def _ungraded_line(summary: dict) -> list[str]:
    ungraded = summary.get("ungraded") or []  # absent from summaries of before
    if not ungraded:
        return []
    shown = ", ".join(f"{u['request_id']} ({u['why']})" for u in ungraded[:10])
    more = f", and {len(ungraded) - 10} more (listed in the summary file)" if len(ungraded) > 10 else ""
    return [f"  not graded: {shown}{more}"]


def round_throughput(stats: list[dict]) -> tuple[float | None, float | None]:
    """A round's tokens/s as a user compares it with another engine's: the tokens its requests generated
    in the sessions that ran them (snapshots' tokens left out) over the wall time any of them was in the
    engine (the union of their intervals, so gaps between sessions do not count); with that wall time.
    Over the RoundStats that have their interval (results of before have none): (None, None) if none has."""
    timed = [s for s in stats if isinstance(s.get("started_at"), (int, float))
             and isinstance(s.get("finished_at"), (int, float))]
    if not timed:
        return None, None
    wall, end = 0.0, float("-inf")
    for start, finish in sorted((s["started_at"], s["finished_at"]) for s in timed):
        wall += max(0.0, finish - max(start, end))
        end = max(end, finish)
    tokens = sum(s["generated_tokens"] - s.get("resumed_tokens", 0) for s in timed)
    return (round(tokens / wall, 3) if wall > 0 else None), round(wall, 3)


def _spec_decode(stats: list[dict]) -> dict:
    """A round's speculative decoding counters summed over the RoundStats that have them (sessions run
    with --speculative-config), with their ratios; {} when none has."""
    with_spec = [s for s in stats if all(isinstance(s.get(name), int) for name in SPEC_DECODE_COUNTS)]
    if not with_spec:
        return {}
    sums = {name: sum(s[name] for s in with_spec) for name in SPEC_DECODE_COUNTS}
    return sums | spec_decode_ratios(sums)


def _spec_cells(row: dict | None) -> str:
    """The round table's speculation columns (drafted and accepted tokens, acceptance rate, tokens per
    verify step); its header with ``row`` None."""
    if row is None:
        return f" {'drafted':>9} {'accepted':>9} {'acc rate':>8} {'tok/verify':>10}"
    if "spec_decode_num_drafts" not in row:
        return f" {'n/a':>9} {'n/a':>9} {'n/a':>8} {'n/a':>10}"
    tpv = row["spec_decode_mean_tokens_per_verify"]
    return (f" {row['spec_decode_num_draft_tokens']:>9} {row['spec_decode_num_accepted_tokens']:>9} "
            f"{_fmt(row['spec_decode_acceptance_rate'], True):>8} {'n/a' if tpv is None else f'{tpv:.2f}':>10}")


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.1f}"


def _acc(mean: float | None, std: float | None) -> str:
    return _fmt(mean, True) + (f" ± {100 * std:.1f}" if std is not None else "")


def format_summary(summary: dict) -> str:
    """A human-readable summary for the terminal."""
    runs = summary.get("runs", 1)
    what = "problems" if runs == 1 else "runs"
    total = summary["completed"] + summary["errors"] if runs > 1 else summary["problems"]
    lines = [
        f"PaCoRe run: {summary['completed']}/{total} {what} completed"
        + (f" ({summary['problems']} problems x {runs} runs)" if runs > 1 else "")
        + f", {summary['errors']} errors, {summary['graded']} graded",
        f"  accuracy (final answer): {_acc(summary['accuracy'], summary.get('accuracy_std'))}   "
        f"self-consistency (majority of {summary['self_consistency_k']} round-1 answers): "
        f"{_acc(summary['self_consistency_accuracy'], summary.get('self_consistency_accuracy_std'))}"
        + (f"   (pass@1 averaged over {runs} runs ± std over runs)" if runs > 1 else ""),
        f"  {'round':>5} {'K':>4} {'acc':>13} {'prompt tok':>11} {'gen tok':>9} {'tok/s':>8} {'tok/s/prob':>10} "
        f"{'cache hit':>10} {'KV saved':>9} {'dropped':>8} {'cut (tokens)':>14}",
    ]
    speculated = any("spec_decode_num_drafts" in r for r in summary["rounds"])  # --speculative-config
    if speculated:
        lines[-1] += _spec_cells(None)
    for r in summary["rounds"]:
        cut = f"{r['truncated_messages']} ({r['truncated_tokens']})"
        lines.append(
            f"  {r['round']:>5} {r['k']:>4} {_acc(r['accuracy'], r.get('accuracy_std')):>13} {r['prompt_tokens']:>11} "
            f"{r['generated_tokens']:>9} {_fmt(r.get('tokens_per_s')):>8} {_fmt(r['mean_tokens_per_s']):>10} "
            f"{r['prefix_cache_hit_tokens']:>10} "
            f"{r['kv_blocks_saved_by_sharing']:>9} {r['dropped_messages']:>8} {cut:>14}"
            + (_spec_cells(r) if speculated else "")
        )
    lines += _confidence_lines(summary["rounds"])
    lines.append(
        f"  effective test-time compute: {summary['effective_compute_tokens_total']} tokens "
        f"({_fmt(summary['effective_compute_tokens_mean'])} per {'run' if runs > 1 else 'problem'}); "
        f"generated: {summary.get('generated_tokens_total', summary['effective_compute_tokens_total'])} tokens"
        + (f" (pools: {summary['pool_generated_tokens']}, once per problem)" if summary.get("pool_generated_tokens")
           else "")
        + f"; KV blocks forks shared instead of copying (sum over requests): "
          f"{summary['kv_blocks_saved_by_sharing_sum']}"
    )
    run = summary.get("run")
    if run:
        lines.append(
            f"  this session: {run['generated_tokens']} tokens in {run['wall_time_s']:.1f}s "
            f"= {run['tokens_per_s']:.1f} tok/s"
            + _replicas(run)
        )
    dispatch = (run or {}).get("dispatch")
    if dispatch and (dispatch["lost"] or dispatch["problems_reassigned"]):
        lost = "; ".join(f"replica {r}: {why}" for r, why in dispatch["lost"].items())
        lines.append(f"  replicas: {len(dispatch['lost'])} of {dispatch['replicas']} lost ({lost}), "
                     f"{dispatch['problems_reassigned']} problems they held reassigned")
    lines += _ungraded_line(summary)
    left_out = summary.get("left_out") or {}
    if left_out.get("problems"):
        more = f" and {left_out['problems'] - len(left_out['ids'])} more" if left_out["problems"] > len(left_out["ids"]) else ""
        lines.append(f"  left out: the records of {left_out['problems']} problems not in --data "
                     f"({', '.join(map(str, left_out['ids']))}{more})")
    for e in summary["error_samples"]:
        run_no = f" run {e['run']}" if runs > 1 and e.get("run") is not None else ""
        lines.append(f"  error [{e['request_id']}{run_no}]: {e['error']}")
    return "\n".join(lines)


def _confidence_lines(rounds: list[dict]) -> list[str]:
    """The confidence table (--record-confidence with grading): per round, the graded trajectories right
    and wrong, each measure's mean over either and its AUROC at telling them apart."""
    rows = [r for r in rounds if r.get("confidence")]
    if not rows:
        return []
    lines = ["  confidence of a trajectory vs its correctness (mean over right / wrong; AUROC 0.5 = no signal):",
             f"  {'round':>5} {'right':>6} {'wrong':>6} {'measured':>13} {'mean logprob':>19} {'AUROC':>6} "
             f"{'lowest group conf':>19} {'AUROC':>6}"]
    partial = []
    for r in rows:
        c = r["confidence"]
        cells = []
        for name in MEASURES:
            m = c[name]
            cells.append(f"{_num(m['correct_mean'])} / {_num(m['incorrect_mean'])}".rjust(19)
                         + f" {_num(m['auroc'], 2):>6}")
        measured, total = c.get("measured"), c.get("trajectories")  # absent from summaries of before
        coverage = "" if total is None else f"{measured} of {total}"
        if total is not None and measured < total:
            partial.append(f"round {r['round']}: {measured} of {total}")
        lines.append(f"  {r['round']:>5} {c['correct']:>6} {c['incorrect']:>6} {coverage:>13} {cells[0]} {cells[1]}")
    if partial:
        lines.append(f"  only some trajectories have the measures ({'; '.join(partial)}): the others were run "
                     f"without --record-confidence (a resume without it); the table is over those measured")
    return lines


def _num(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _replicas(run: dict) -> str:
    dispatch = run.get("dispatch")
    if dispatch:  # handed out as each had room, so the counts say how the work was shared
        return (f" on {dispatch['replicas']} replicas (problems handed to each: "
                f"{', '.join(map(str, dispatch['problems_per_replica']))})")
    return f" on {len(run['replicas'])} replicas" if run.get("replicas") else ""


def write_summary(cfg: RunConfig, wall: float, sessions: list[dict], dispatch: dict | None = None) -> dict:
    """Summarize the whole results file plus this session's engines (one per replica); write it.

    ``dispatch``: a data-parallel run's replicas, those lost and the problems reassigned (replicas/driver.py).
    """
    summary = summarize(read_results(cfg.out_path), list(cfg.schedule), read_problem_set(cfg.out_path))
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
    if dispatch is not None:
        summary["run"]["dispatch"] = dispatch
    summary["config"] = cfg.to_dict()
    write_json(summary_path(cfg.out_path), summary)
    return summary


def _sum_stats(sessions: list[dict]) -> dict:
    """Engine counters added up over replicas (bytes per block and per token are the same for all)."""
    total: dict = {}
    estimates: dict[str, list] = {}  # per-replica estimates (self-drafting's acceptance): their mean
    for s in sessions:
        for key, value in s["engine_stats"].items():
            if key.endswith("_estimate"):
                estimates.setdefault(key, []).append(value)
            elif isinstance(value, (int, float)) and key not in ("kv_bytes_per_block", "kv_bytes_per_token"):
                total[key] = total.get(key, 0) + value
            elif isinstance(value, list) and isinstance(total.get(key), list):  # per position: added up
                total[key] = [a + b for a, b in zip(total[key], value)]
            elif isinstance(value, dict) and isinstance(total.get(key), dict):  # steps per depth: added up
                total[key] = {k: total[key].get(k, 0) + value.get(k, 0) for k in total[key].keys() | value.keys()}
            else:
                total.setdefault(key, value)
    total |= {key: sum(v) / len(v) for key, v in estimates.items()}
    if all(name in total for name in SPEC_DECODE_COUNTS):  # the ratios of the sums, not sums of ratios
        total.update(spec_decode_ratios(total))
    return total


def show_summary(summary: dict, cfg: RunConfig) -> None:
    """Print the summary and where the results are."""
    print(format_summary(summary))
    print(f"results: {cfg.out_path}\nsummary: {summary_path(cfg.out_path)}")
