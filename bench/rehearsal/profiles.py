"""The acceptance a rehearsed speculative configuration drafts at, and the drafts that follow it.

A rehearsal's trajectories are scripted, so a drafter's acceptance cannot come from its text: each
configuration reads it from a profile (``--spec-profile``, bench/rehearsal/spec_profile.json, measured on the
embedded model and capped by published figures: engine/rehearsal/drafter.py) or takes a flat one
(``--spec-acceptance``). A configuration whose section of the profile is missing is refused, naming the bench
command that measures it: no acceptance is made up.
"""
from __future__ import annotations

from bench.rehearsal.checks import Refused
from bench.rehearsal.shapes import SHAPES
from bench.rehearsal.workload import round_of


def spec_profiles(args, options: dict, temperature: float):
    """The acceptance profiles of a speculative configuration (None for the others): the measured
    ones (--spec-profile: n-gram drafts, round 1's for round 1, round 2's for the rounds whose prompt
    holds references; self-drafting, by context at its window and sink, for --spec-self-rule, capped by
    the published long-context figures and read from them past the measured contexts:
    WindowProfile.capped), or flat with --spec-acceptance. From that window profile: sparse self-drafting
    (``selected``) takes the window reading as much KV, raised by the measured sparse / window gain of its
    selection (key bounds: section self_sparse; the last verify's attention: self_verify) and past the measured
    contexts by at most the published Quest one (sparse_profile; for "verify", nor by more than its last measured
    gain); layer-skip (``draft_layers``) the window's scaled by the measured layer-skip / full-depth ratio, at
    most 1 (layerskip_profile). Refused when the profile cannot be read."""
    from engine.rehearsal.drafter import (KINDS, VEGAS_QUEST_OVER_STREAMING, DraftProfile, WindowProfile,
                                          layerskip_profile, load_profiles, load_self_layerskip, load_self_sparse,
                                          load_self_window, sparse_profile)
    spec = options.get("speculative_config")
    if spec is None:
        return None
    nst, self_window = spec["num_speculative_tokens"], spec["method"] == "self_window"
    if args.spec_acceptance is not None:
        if self_window:
            return WindowProfile.flat(args.spec_acceptance, nst)
        return dict.fromkeys(KINDS, DraftProfile.flat(args.spec_acceptance, nst))
    rule = args.spec_self_rule
    try:
        if not self_window:
            return load_profiles(args.spec_profile, nst, temperature)
        selected, layers = spec.get("selected", 0), spec.get("draft_layers", 0)
        # sparse: the window that reads as much KV per draft step, raised by the measured gain (sparse_profile)
        measured = load_self_window(args.spec_profile, spec["window"] + selected, spec["sink"], rule, temperature)
        profile = measured if getattr(args, "spec_self_uncapped", False) else measured.capped()
        if selected:
            verify = spec.get("selection", "bounds") == "verify"
            ratios = load_self_sparse(args.spec_profile, spec["window"], selected, spec["sink"], rule, temperature,
                                      depth=nst, section="self_verify" if verify else "self_sparse")
            published = min(VEGAS_QUEST_OVER_STREAMING, ratios[-1][1]) if verify else VEGAS_QUEST_OVER_STREAMING
            profile = sparse_profile(profile, ratios, published_ratio=published)
        if layers:
            total = SHAPES[getattr(args, "shape", "qwen3-8b")]["num_hidden_layers"]
            if layers > total:
                raise ValueError(f"draft_layers={layers} is more than the shape's {total} layers")
            ratios = load_self_layerskip(args.spec_profile, layers, total, spec["window"] + selected, spec["sink"],
                                         rule, temperature, depth=nst)
            profile = layerskip_profile(profile, ratios)
        return profile
    except (OSError, ValueError, KeyError) as e:
        raise Refused(f"--spec-profile {args.spec_profile}: {e}") from None


def scripted_drafts(llm, profiles, seed: int) -> None:
    """The rehearsal's drafts: a scripted trajectory has no text to match (n-gram) and no model runs
    (self-drafting: the draft steps' draws)."""
    from engine.rehearsal.drafter import use_scripted_drafter, use_scripted_self_drafts
    if llm.speculator.self_drafting:
        use_scripted_self_drafts(llm, profiles, seed=seed)
    else:
        use_scripted_drafter(llm, profiles, lambda rid: "round1" if round_of(rid) == 1 else "round2", seed=seed)
