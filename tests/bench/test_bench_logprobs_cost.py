"""bench.logprobs_cost times the sampler step without and with top-k logprobs and models the H200 cost."""
from bench.logprobs_cost import PASSES, measure


def test_logprobs_cost_reports_both_steps_and_the_modelled_bytes():
    r = measure(rows=4, vocab=1000, top=20, repeats=1)
    assert r["rows"] == 4 and r["plain_ms"] > 0 and r["logprobs_ms"] > 0
    assert r["ratio"] == r["logprobs_ms"] / r["plain_ms"]
    # fp32 logits of 4 rows x 1000, read or written PASSES times, at 4.0 TB/s
    assert r["h200_extra_ms"] == PASSES * 4 * 1000 * 4 / 4.0e12 * 1e3
