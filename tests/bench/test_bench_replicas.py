"""bench.replicas runs its workload on 1 replica and on 2 and reports both (a tiny model, a few tokens)."""
from bench.replicas import main


def test_replicas_bench_reports_both(tiny_model_dir, capsys):
    assert main(["--model", str(tiny_model_dir("qwen3")), "--problems", "2", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "1 replica  (processes)" in out and "2 replicas (processes)" in out and "ratio 2 processes / 1: " in out
