"""bench.sampler_cost: the sampler's draws equal the plain statement's in every case it times."""
from bench.sampler_cost import main


def test_every_case_draws_what_the_plain_statement_draws(capsys):
    assert main(["--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("identical") == 5 and "DIFFERENT" not in out
