"""The bandwidth floor beside every rehearsed row (issue 51 item 4): the bytes the same trajectories need (the
weights once per target step, each row's context once, a request's shared prompt once, new prompt tokens once;
draft steps free), priced at the copy bandwidth and at the modelled efficiencies, extrapolated as the row is."""
import json

import pytest

from engine.device_model import DeviceParams
from engine.rehearsal.floor import FloorBytes, RequestRows, step_floor
from engine.core.step_shape import ModelShape

from bench.rehearsal import protocol
from bench.rehearsal.__main__ import main
from bench.rehearsal.retable import main as retable

SHAPE = ModelShape(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16,
                   vocab_size=1000, dtype_bytes=2)
DEV = DeviceParams(hbm_bytes_per_s=4e12, linear_bw_eff=0.85, attention_bw_eff=0.75)


def test_a_steps_floor_reads_each_context_once_a_shared_prompt_once_and_the_weights_once():
    W, K = SHAPE.weight_bytes, SHAPE.kv_bytes_per_token
    rows = [RequestRows("a", [100, 100], [1, 1], shared=60),  # 200 + 2 read, the shared 60 once: 142, + 2 stored
            RequestRows("b", [50], [3])]                       # a verify row: 53 read once for its 3 queries, 3 stored
    floor = step_floor(rows, [("c", 10)], SHAPE)               # 10 new prompt tokens stored
    assert floor["a"].kv == 144 * K and floor["b"].kv == 56 * K and floor["c"].kv == 10 * K
    # the weights once, shared out by the step's tokens: 2 + 3 + 10
    assert [floor[k].weights for k in "abc"] == pytest.approx([2 / 15 * W, 3 / 15 * W, 10 / 15 * W])
    assert step_floor([], [("c", 0)], SHAPE)["c"].weights == 0  # a step of recompute only: not in the floor


def test_the_floor_is_priced_at_the_copy_bandwidth_and_at_the_modelled_efficiencies():
    f = FloorBytes(weights=4e12 * 0.85, kv=4e12 * 0.75)
    assert f.seconds(DEV, efficiencies=False) == pytest.approx(1.6)
    assert f.seconds(DEV, efficiencies=True) == pytest.approx(2.0)


def test_the_protocols_floor_is_extrapolated_round_by_round_as_its_hours():
    """1 problem x 1 run rehearsed of 2 x 2 (K = [2], then 1): rounds 1 and 2 scale by 4, their floors alike."""
    proto = protocol.Protocol(problems=2, runs=2, pool=None, gpus=1, schedule=(2, 1), sample=(1, 1))
    copy_5s, copy_2_5s = {"weights": 0.0, "kv": 5 * 4e12}, {"weights": 1e12, "kv": 2.25 * 4e12}
    res = {"rounds": {"1": {"tokens": 1000, "tokens_per_s": 100.0, "floor_bytes": copy_5s},
                      "2": {"tokens": 500, "tokens_per_s": 50.0, "floor_bytes": copy_2_5s}}}
    e = protocol.extrapolate(proto, res, DEV)
    assert e["seconds"] == pytest.approx(80.0)  # 4,000 tokens at 100/s, 2,000 at 50/s
    assert e["floor_hours"]["copy"] * 3600 == pytest.approx(4 * 5 + 4 * 2.5)
    assert e["floor_hours"]["modelled"] * 3600 == pytest.approx(4 * 5 / 0.75 + 4 * (0.25 / 0.85 + 2.25 / 0.75))
    assert "2.67x / " in protocol.table(proto, {"toy": {"protocol": e}})
    del res["rounds"]["2"]["floor_bytes"]  # a report written before the floor was recorded
    e = protocol.extrapolate(proto, res, DEV)
    assert e["floor_hours"] is None and "not recorded" in protocol.table(proto, {"old": {"protocol": e}})


def test_every_rehearsed_row_prints_its_floor_and_is_no_faster_than_it(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["--shape", "tiny", "--preset", "low", "--problems", "2", "--runs", "2", "--mean-tokens", "600",
                 "--kv-tokens", "20000", "--config", "fp8", "--config", "fp8+spec-self", "--spec-acceptance", "0.8",
                 "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "floor h: copy bw / modelled eff." in printed and "not recorded" not in printed
    dev = DeviceParams.named("h200")
    for name in ("fp8", "fp8+spec-self"):
        res = json.loads((out / name / "report.json").read_text())
        for f in res["rounds"].values():
            floor = FloorBytes(**f["floor_bytes"])
            assert 0 < floor.seconds(dev, False) < floor.seconds(dev, True) <= f["seconds"] - f["draft_seconds"]
        hours = res["protocol"]["floor_hours"]
        assert hours["copy"] < hours["modelled"] < res["protocol"]["hours"]
    # the saved reports give the same table again
    assert retable(["--preset", "low", "--problems", "2", "--runs", "2", str(out / "fp8" / "report.json")]) == 0
    again = capsys.readouterr().out
    row = next(line for line in printed.split("protocol:")[1].splitlines() if line.startswith("| fp8 |"))
    assert row in again
