"""What a self-drafting draft step is priced at (issue 51 item 3): the layers it runs, its window and sink,
its selected blocks and, for selection "bounds" only, the key bounds of every block it scores; the depth
policy and the rehearsal charge the same, and only bounds selection keeps bounds in the cache."""
import pytest

from engine.device_model import PRESETS, DecodeGroup, DraftRead, StepWork, bounds_tokens, speculation_seconds, step_cost
from engine.spec.config import SpeculativeConfig
from engine.spec.policy import DepthPolicy
from engine.core.step_shape import ModelShape

# PaCoRe-8B (Qwen3-8B) with an FP8 cache
SHAPE = ModelShape(num_layers=36, hidden_size=4096, intermediate_size=12288, num_heads=32, num_kv_heads=8,
                   head_dim=128, vocab_size=151936, dtype_bytes=2, qk_norm=True, kv_dtype_bytes=1)
H200 = PRESETS["h200"]
BOUNDS = DraftRead(256, 16, selected=256, selection="bounds")
VERIFY = DraftRead(256, 16, selected=256, selection="verify")


def test_a_draft_step_reads_its_window_selected_blocks_and_only_bounds_selection_its_key_bounds():
    # 49,152 tokens = 3,072 blocks; sink 1 block, window 16 blocks, selected 16 blocks: 33 blocks = 528 tokens
    assert DraftRead(512, 16).tokens(49_152, SHAPE) == 528
    assert VERIFY.tokens(49_152, SHAPE) == 528
    # bounds: the 3,072 - 1 - 16 blocks between sink and window scored, each 2 bf16 vectors per layer = 2 FP8 tokens
    assert bounds_tokens(SHAPE) == 2.0
    assert BOUNDS.tokens(49_152, SHAPE) == 528 + 2 * 3_055
    assert VERIFY.tokens(300, SHAPE) == 300  # a short row reads all of itself (19 blocks)...
    assert BOUNDS.tokens(300, SHAPE) == 300 + 2 * 2  # ...and bounds selection scores the 2 between sink and window


def test_layer_skip_reads_its_share_of_the_layers_and_the_whole_lm_head():
    skip = DraftRead(512, 16, layers=27).shape(SHAPE)
    lm_head_and_final_norm = 2 * (SHAPE.vocab_size * SHAPE.hidden_size + SHAPE.hidden_size)
    per_layer = (SHAPE.weight_bytes - lm_head_and_final_norm) / 36
    assert skip.weight_bytes == pytest.approx(lm_head_and_final_norm + 27 * per_layer)
    assert skip.kv_bytes_per_token * 36 == SHAPE.kv_bytes_per_token * 27
    assert DraftRead(512, 16).shape(SHAPE) is SHAPE
    with pytest.raises(ValueError, match="draft_layers=40 keeps more layers than the model's 36"):
        DraftRead(512, 16, layers=40).shape(SHAPE)


def test_the_policy_prices_the_draft_step_at_what_it_reads():
    ctx = [49_152] * 24
    window, bounds, verify = (speculation_seconds(SHAPE, H200, d) for d in (DraftRead(512, 16), BOUNDS, VERIFY))
    skip = speculation_seconds(SHAPE, H200, DraftRead(512, 16, layers=27))
    assert verify(ctx, 4) == pytest.approx(window(ctx, 4))  # the same 528 tokens, nothing else
    assert bounds(ctx, 4)[0] > 1.3 * window(ctx, 4)[0]  # + 6,110 tokens of bounds per row
    assert bounds(ctx, 4)[1] == window(ctx, 4)[1]  # the verify pass is the same
    assert skip(ctx, 4)[0] < 0.85 * window(ctx, 4)[0]
    expected = step_cost(StepWork(decodes=[DecodeGroup("", [528 + 6_110] * 24)], sampled=24), SHAPE, H200)[0].total
    assert bounds(ctx, 4)[0] == pytest.approx(expected)


def test_costlier_draft_steps_make_the_policy_draft_less():
    """At the same acceptance, pricing the key bounds' read makes the adaptive depth shallower (the policy priced
    a bounds step as the window alone before issue 51, so it drafted too deep)."""
    ctx = [65_536] * 24
    depths = {}
    for name, draft in (("verify", VERIFY), ("bounds", BOUNDS)):
        policy = DepthPolicy(6, speculation_seconds(SHAPE, H200, draft), prior=0.7)
        depths[name] = policy.choose(ctx)
    assert depths == {"verify": 4, "bounds": 3}


def test_selection_and_draft_layers_are_validated():
    base = {"method": "self_window", "num_speculative_tokens": 4}
    cfg = SpeculativeConfig.from_dict(base | {"selected": 256, "selection": "verify", "draft_layers": 27})
    assert (cfg.selection, cfg.draft_layers) == ("verify", 27)
    assert DraftRead.of(cfg, 16) == DraftRead(512, 16, 0.0, 256, "verify", 27, 16)
    assert SpeculativeConfig.from_dict(base).selection == "bounds" and SpeculativeConfig.from_dict(base).draft_layers is None
    with pytest.raises(ValueError, match="selection must be one of"):
        SpeculativeConfig.from_dict(base | {"selected": 256, "selection": "attention"})
    with pytest.raises(ValueError, match="give selected > 0"):
        SpeculativeConfig.from_dict(base | {"selection": "verify"})
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="draft_layers"):
            SpeculativeConfig.from_dict(base | {"draft_layers": bad})
    with pytest.raises(ValueError, match="apply to method 'self_window'"):
        SpeculativeConfig.from_dict({"method": "ngram", "draft_layers": 4})


@pytest.mark.parametrize("selection,bounds", [("bounds", True), ("verify", False)])
def test_only_bounds_selection_keeps_bounds_in_the_rehearsed_cache(tiny_model_dir, selection, bounds):
    from engine import LLM
    spec = {"method": "self_window", "num_speculative_tokens": 4, "window": 16, "sink": 16}
    llm = LLM(str(tiny_model_dir("llama")), device_model="h200", kv_cache_dtype="fp8_e4m3",
              gpu_memory_utilization=0.014, speculative_config=spec | {"selected": 16, "selection": selection})
    runner = llm.runner
    kv = runner.shape.kv_bytes_per_token * runner.block_size
    assert runner.kv_bytes_per_block == kv + (2 * runner.shape.kv_bytes_per_token if bounds else 0)
    assert runner.draft_read == DraftRead(16, 16, 0.0, 16, selection, None, runner.block_size)
