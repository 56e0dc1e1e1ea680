"""The summary's per-round tok/s: the round's new tokens over the wall time its requests were in the
engine (what a user compares with another engine), beside the per-problem mean (tok/s/prob)."""
from types import SimpleNamespace

from pacore.evaluate.stats import RoundStats, round_stats_from_output
from pacore.evaluate.summary import format_summary, round_throughput, summarize


def _stats(round_no: int, tokens: int, start: float | None, end: float | None, resumed: int = 0, **kw) -> dict:
    s = RoundStats(round_no, 2, 10, tokens, 0.0, (end or 1.0) - (start or 0.0), 0.0, 0, 0, 0, 0, 0,
                   started_at=start, finished_at=end, resumed_tokens=resumed, **kw)
    s.tokens_per_s = (tokens - resumed) / (end - start) if start is not None else 1.0
    return s.to_dict()


def _record(pid: str, *rounds: dict, **kw) -> dict:
    return {"request_id": pid, "rounds_stats": list(rounds), "correct": None, **kw}


def test_round_tok_s_is_its_tokens_over_its_wall_time_not_the_mean_of_problem_rates():
    records = [  # round 1 overlaps (0-10 and 5-15: 15 s); round 2 ran in two sessions (100-110, 200-205)
        _record("a", _stats(1, 100, 0.0, 10.0), _stats(2, 30, 100.0, 110.0)),
        _record("b", _stats(1, 200, 5.0, 15.0), _stats(2, 60, 200.0, 205.0, resumed=15)),
    ]
    r1, r2 = summarize(records, [2, 1])["rounds"]
    assert (r1["tokens_per_s"], r1["wall_time_s"]) == (20.0, 15.0)  # 300 tokens / 15 s
    assert r1["mean_tokens_per_s"] == 15.0  # (10 + 20) / 2: each problem's own rate, kept under its own name
    assert (r2["tokens_per_s"], r2["wall_time_s"]) == (5.0, 15.0)  # (30 + 45 new) / (10 + 5), the gap left out
    table = format_summary({**summarize(records, [2, 1]), "run": None})
    header, row1 = table.splitlines()[2:4]
    assert header.split()[7:9] == ["tok/s", "tok/s/prob"] and row1.split()[5:7] == ["20.0", "15.0"]


def test_results_without_intervals_and_pools():
    old = _record("old", _stats(1, 50, None, None))  # written before rounds had their interval
    assert "started_at" not in old["rounds_stats"][0] and "resumed_tokens" not in old["rounds_stats"][0]
    row = summarize([old], [1])["rounds"][0]
    assert row["tokens_per_s"] is None and row["mean_tokens_per_s"] == 1.0
    assert "n/a" in format_summary({**summarize([old], [1]), "run": None}).splitlines()[3]
    # round 1 drawn from a pool: the pool request's tokens and interval, once, not the draws'
    pool = {"generated_tokens": 400, "stats": _stats(1, 400, 0.0, 8.0)}
    drawn = [_record("p", _stats(1, 100, None, None, pool=4), run=r, pool=pool) for r in range(2)]
    assert round_throughput([s for r in drawn for s in r["rounds_stats"]]) == (None, None)
    assert summarize(drawn, [1])["rounds"][0]["tokens_per_s"] == 50.0


def test_a_round_records_its_interval_and_resumed_tokens():
    metrics = SimpleNamespace(arrival_time=10.0, first_token_time=12.0, finished_time=14.0)
    out = SimpleNamespace(metrics=metrics, outputs=[SimpleNamespace(token_ids=[1] * 40, finish_reason="stop")],
                          prompt_token_ids=[1] * 5, num_cached_tokens=0)
    s = round_stats_from_output(1, 1, out, references=0, dropped=0, truncated=0, resumed=8)
    assert round(s.finished_at - s.started_at, 3) == 4.0 and s.resumed_tokens == 8 and s.tokens_per_s == 8.0
    assert round_throughput([s.to_dict()]) == (8.0, 4.0)


def test_the_readme_and_docs_show_the_summary_as_it_prints():
    """README's demo block and docs/pacore-runs.md's have the columns format_summary prints, and the
    docs define each of them."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    records = [_record("a", _stats(1, 100, 0.0, 10.0), _stats(2, 30, 100.0, 110.0))]
    header = format_summary({**summarize(records, [2, 1]), "run": None}).splitlines()[2]
    docs = (root / "docs" / "pacore-runs.md").read_text()
    for page in (root / "README.md", root / "docs" / "pacore-runs.md"):
        block = re.search(r"```\n(PaCoRe run: .*?)```", page.read_text(), re.S).group(1)
        assert block.splitlines()[2] == header, page.name
    columns = ["round", "K", "acc", "prompt tok", "gen tok", "tok/s", "tok/s/prob", "cache hit", "KV saved", "dropped",
               "cut (tokens)"]
    assert header.split() == " ".join(columns).split()
    section = docs.split("### The summary", 1)[1].split("\n### ", 1)[0]
    assert all(f"`{column}`" in section for column in columns)
