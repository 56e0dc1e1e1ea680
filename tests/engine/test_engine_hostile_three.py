"""Hostile input, round three (issue 38, the engine's items): self-drafting's sink and window bounded at
parse time (7), its cost_model read before any model loads (8), every JSON file read refusing over-nested
input in one line (9); stop_token_ids outside the vocabulary (10) are in test_engine_hostile.py, beside
its engine."""
import argparse
import json

import pytest

from engine.config import ModelConfig, json_object, speculative_json
from engine.device_model import DeviceParams
from engine.jsonfile import read_json
from engine.rehearsal.drafter import load_profiles, load_self_window
from engine.spec.config import MAX_SPAN, SpeculativeConfig

NESTED = "[" * 100_000 + "]" * 100_000


# -- 7. sink and window bounded when the config is parsed ----------------------------------------------
@pytest.mark.parametrize("key", ["sink", "window"])
def test_a_sink_or_window_beyond_any_context_is_refused_at_parse_time(key):
    SpeculativeConfig.from_dict({"method": "self_window", "policy": "fixed", key: MAX_SPAN})  # at the limit
    for value in (MAX_SPAN + 1, 2**31):
        with pytest.raises(ValueError, match=f"{key}={value} is above {MAX_SPAN} tokens \\(MAX_SPAN"):
            SpeculativeConfig.from_dict({"method": "self_window", key: value})
    with pytest.raises(argparse.ArgumentTypeError, match=f"{key}=2147483648"):
        speculative_json(json.dumps({"method": "self_window", key: 2**31}))


# -- 8. cost_model read when the config is parsed, not after the model loads ---------------------------
def test_a_cost_model_that_cannot_be_read_is_refused_at_parse_time(tmp_path):
    bad = tmp_path / "device.json"
    bad.write_text('{"matmul_eff": 3}')
    for path, why in ((tmp_path / "none.json", "unknown device"), (bad, "matmul_eff must be")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            speculative_json(json.dumps({"method": "self_window", "cost_model": str(path)}))
    bad.write_text("{}")
    SpeculativeConfig.from_dict({"method": "self_window", "cost_model": str(bad)})  # a readable one: taken


# -- 9. over-nested JSON: one line, never a RecursionError -------------------------------------------
def test_every_json_file_refuses_over_nested_input_in_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text(NESTED)
    readers = [DeviceParams.from_file, DeviceParams.named, read_json,
               lambda p: load_profiles(p, 4, 1.0), lambda p: load_self_window(p, 512, 16, "coupled", 1.0)]
    for read in readers:
        with pytest.raises(ValueError, match="nested too deeply") as e:
            read(str(deep))
        assert str(deep) in str(e.value) and "\n" not in str(e.value)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(NESTED)
    with pytest.raises(ValueError, match="nested too deeply"):
        ModelConfig.from_pretrained(model)
    with pytest.raises(argparse.ArgumentTypeError, match="nested too deeply"):
        json_object(NESTED)
