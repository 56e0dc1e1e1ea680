"""Tables and PNG plots of the benchmark results (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from engine.profiler import plot_kv_timeline

_METRICS = ("gen_tok_s", "prefill_tok_s", "wall_s", "kv_peak_bytes", "kv_per_problem_bytes", "kv_logical_peak_bytes")


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(results: list[dict]) -> list[dict]:
    """Per system and round (and round "all": the rounds summed per repeat): medians over repeats,
    and each metric divided by the engine's (x_<metric>)."""
    by_key: dict[tuple, list[dict]] = {}
    for r in results:
        by_key.setdefault((r["system"], r["round"]), []).append(r)
        tot = by_key.setdefault((r["system"], "all", r["repeat"]), [])
        tot.append(r)
    rows = []
    for key, rs in by_key.items():
        if key[1] == "all":
            continue  # built below from the per-repeat totals
        rows.append(dict(system=key[0], round=key[1], k=rs[0]["k"], ok=all(x["ok"] for x in rs),
                         error=next((x["error"] for x in rs if x["error"]), None),
                         **{m: _median(x[m] for x in rs if x["ok"]) for m in _METRICS}))
    for system in dict.fromkeys(r["system"] for r in results):
        totals = []
        for key, rs in by_key.items():
            if key[0] == system and key[1] == "all":
                wall, pre = sum(x["wall_s"] for x in rs), sum(x["prefill_s"] for x in rs)
                totals.append(dict(ok=all(x["ok"] for x in rs), wall_s=wall,
                                   gen_tok_s=sum(x["gen_tokens"] for x in rs) / wall if wall else None,
                                   prefill_tok_s=sum(x["prompt_tokens"] for x in rs) / pre if pre else None,
                                   kv_peak_bytes=max((x["kv_peak_bytes"] or 0) for x in rs),
                                   kv_per_problem_bytes=max((x["kv_per_problem_bytes"] or 0) for x in rs),
                                   kv_logical_peak_bytes=max((x["kv_logical_peak_bytes"] or 0) for x in rs) or None))
        ok = all(t["ok"] for t in totals)
        rows.append(dict(system=system, round="all", k=None, ok=ok, error=None,
                         **{m: _median(t[m] for t in totals) if ok else None for m in _METRICS}))
    order = list(dict.fromkeys(r["system"] for r in results))
    rows.sort(key=lambda r: (r["round"] == "all", r["round"] if r["round"] != "all" else 0, order.index(r["system"])))
    engine = {r["round"]: r for r in rows if r["system"] == "engine"}
    for r in rows:
        e = engine.get(r["round"], {})
        for m in _METRICS[:5]:
            r["x_" + m] = r[m] / e[m] if r["ok"] and r[m] is not None and e.get(m) else None
    return rows


def format_report(data: dict) -> str:
    w, rows = data["workload"], data["summary"]
    mib = 2 ** 20
    lines = [f"workload: {w['problems']} problems, K per round {w['schedule']}, {w['prompt_len']}-token problems "
             f"(+ chat template), {w['gen_len']} tokens per trajectory, {w['model']}, {w['dtype']}, {w['device']}, "
             f"{w['threads']} threads, {w['repeats']} repeat(s), medians",
             f"{'round':>5}{'K':>3} {'system':19}{'gen tok/s':>10}{'prefill tok/s':>14}{'wall s':>8}{'KV MiB':>8}"
             f"{'KV/problem':>11} | x engine: {'gen':>5}{'prefill':>8}{'wall':>6}{'KV/problem':>11}"]
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
    for r in rows:
        head = f"{str(r['round']):>5}{fmt(r['k'], 'd') if r['k'] else '':>3} {r['system']:19}"
        if not r["ok"]:
            lines.append(head + f"n/a: {r['error'] or 'failed in some round'}")
            continue
        kv, kvp = (r[m] / mib if r[m] is not None else None for m in ("kv_peak_bytes", "kv_per_problem_bytes"))
        lines.append(head + f"{fmt(r['gen_tok_s'], '.1f'):>10}{fmt(r['prefill_tok_s'], '.0f'):>14}"
                     f"{fmt(r['wall_s'], '.2f'):>8}{fmt(kv, '.2f'):>8}{fmt(kvp, '.2f'):>11} |           "
                     f"{fmt(r['x_gen_tok_s'], '.2f'):>5}{fmt(r['x_prefill_tok_s'], '.2f'):>8}"
                     f"{fmt(r['x_wall_s'], '.2f'):>6}{fmt(r['x_kv_per_problem_bytes'], '.2f'):>11}")
    lines.append("prefill tok/s: each problem's prompt once, over the time until all its trajectories had a first "
                 "token. KV MiB: peak bytes held for K/V in the round; KV/problem: that / problems held at once "
                 "(hf_generate runs one problem at a time, the others all at once).")
    by = {(r["system"], r["round"]): r for r in rows}
    lines += ["", "engine, where the time went (step timeline; host = scheduler + sampling/forks/stop checks):"]
    lines += [f"  {label}: " + _time_split(steps) for label, steps in _by_label(data["engine_timeline"]).items()]
    lines.append("\nratios, all rounds (engine vs each; >1 = the engine is better):")
    for r in rows:
        if r["round"] != "all" or r["system"] == "engine":
            continue
        if not r["ok"]:
            lines.append(f"  vs {r['system']:19} n/a")
            continue
        inv = lambda v: f"{1 / v:.2f}x" if v else "-"  # noqa: E731
        lines.append(f"  vs {r['system']:19} generated tok/s {inv(r['x_gen_tok_s'])}, prefill tok/s "
                     f"{inv(r['x_prefill_tok_s'])}, wall time {fmt(r['x_wall_s'], '.2f')}x, "
                     f"peak KV per problem {fmt(r['x_kv_per_problem_bytes'], '.2f')}x")
    for rnd in sorted(x["round"] for x in rows if x["system"] == "engine" and x["round"] != "all"):
        eng, nos = by[("engine", rnd)], by.get(("engine_no_sharing", rnd))
        lines.append(f"  KV held by the engine, round {rnd} (K={eng['k']}): {eng['kv_peak_bytes'] / mib:.1f} MiB; "
                     f"the same sequences without sharing: {(eng['kv_logical_peak_bytes'] or 0) / mib:.1f} MiB"
                     + (f", measured with fork and prefix caching off: {nos['kv_peak_bytes'] / mib:.1f} MiB"
                        if nos and nos["ok"] else ""))
    return "\n".join(lines)


def _by_label(timeline: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in timeline:
        out.setdefault(s["label"], []).append(s)
    return out


def _time_split(steps: list[dict]) -> str:
    total = sum(s["schedule_s"] + s["model_s"] + s["sample_s"] for s in steps) or 1e-12
    pre = sum(s["schedule_s"] + s["model_s"] + s["sample_s"] for s in steps if s["kind"] != "decode")
    dec = [s for s in steps if s["kind"] == "decode"]
    host = sum(s["schedule_s"] + s["sample_s"] for s in steps)
    med = statistics.median(s["schedule_s"] + s["model_s"] + s["sample_s"] for s in dec) * 1e3 if dec else 0.0
    sample = statistics.median(s["sample_s"] for s in dec) * 1e3 if dec else 0.0
    rows = max((s["num_decode_seqs"] for s in dec), default=0)
    return (f"{len(steps)} steps, {total:.1f} s: prefill/mixed steps {pre / total:.0%}, decode steps "
            f"{1 - pre / total:.0%} (median {med:.0f} ms at up to {rows} sequences, of which sampling "
            f"{sample:.1f} ms); host {host / total:.1%}, model forward {1 - host / total:.1%}")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_throughput(rows: list[dict], path: str | Path, title: str = "") -> None:
    """rows: bench.pacore_throughput results (system, round, gen_tok_s, kv_peak_bytes, ok).
    Left: generated tokens/s per round per system; right: peak KV bytes per round per system."""
    plt = _pyplot()
    rows = [r for r in rows if r["round"] != "all"]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    rounds = sorted({r["round"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(systems))
    for i, name in enumerate(systems):
        by_round = {r["round"]: r for r in rows if r["system"] == name}
        xs = [x + (i - (len(systems) - 1) / 2) * width for x in range(len(rounds))]
        for ax, key, scale in ((axes[0], "gen_tok_s", 1.0), (axes[1], "kv_peak_bytes", 1 / 2**20)):
            vals = [(by_round[r][key] or 0) * scale if r in by_round and by_round[r]["ok"] else 0 for r in rounds]
            ax.bar(xs, vals, width, label=name)
    labels = [f"round {r}\nK={next(x['k'] for x in rows if x['round'] == r)}" for r in rounds]
    for ax, ylabel in ((axes[0], "generated tokens / s"), (axes[1], "peak KV held (MiB)")):
        ax.set_xticks(range(len(rounds)), labels)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].set_title("hf_generate holds one problem at a time, the others all problems", fontsize=8)
    if not all(r["ok"] for r in rows):
        axes[0].set_title("systems that could not run (n/a) are left empty", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_throughput_report(data: dict, out: Path) -> str:
    """bench.pacore_throughput's outputs: JSON (raw + summary), table, the two PNGs; returns the table."""
    data["summary"] = summarize(data["results"])
    out.mkdir(parents=True, exist_ok=True)
    title = " ".join(f"{k}={v}" for k, v in data["workload"].items() if k != "model")
    plot_throughput(data["summary"], out / "pacore_throughput.png", title)
    plot_kv_timeline(data["engine_timeline"], data["kv_bytes_per_block"], out / "pacore_kv_timeline.png",
                     "engine: KV held per step vs the same sequences without sharing")
    (out / "pacore_throughput.json").write_text(json.dumps(data, indent=1))
    report = format_report(data)
    (out / "pacore_throughput.txt").write_text(report + "\n")
    return report
