"""Self-speculative layer skipping (speculative_config ``draft_layers``, method "self_window").

A draft step reads the whole weights once per draft token: on a modelled H200, 1,410 of PaCoRe-8B's
1,539 s of draft time (issue 51). With ``draft_layers`` a draft step runs the embedding, only the kept
decoder layers, the final norm and the LM head (Draft & Verify, arXiv 2309.08168; SWIFT, arXiv
2410.06916: the model's own intermediate layers skipped, no extra weights); the verify pass runs every
layer, so the output is what it is without it.

KV: a draft step writes K/V only in the layers it runs. The skipped layers' slots at the drafted
positions keep what they held, and nothing reads them before the verify pass, which writes every
layer's K/V at every position it verifies before attending to it: the same overwrite that makes the
window's draft KV harmless.

Which layers, given a count n of N: the first ceil(n/2) and the last floor(n/2), a contiguous middle block
of N - n layers skipped. Layer-pruning studies find the first and last layers unlike the rest and the
middle ones nearly interchangeable ("Transformer Layers as Painters", arXiv 2407.09298); SWIFT and
Draft & Verify search their skip sets among the intermediate layers. Measured on the embedded model
(SmolLM2-135M, 30 layers, window 512 + sink 16; bench/spec_layerskip_acceptance.py, docs/speculative.md):
keeping 22 layers, a middle block skipped keeps 0.42-0.45 of the full-depth drafts' tokens per verify at 6
drafts, the same count spread evenly from the first layer to the last (Unified Layer Skipping's balanced
choice, arXiv 2404.06954) 0.22-0.24; in a smaller probe a block of the last layers but one skipped
accepted no draft at all. A list names the layers exactly (a searched set, say).
"""
from __future__ import annotations


def check_draft_layers(value) -> int | tuple[int, ...]:
    """``draft_layers`` as the config gives it, checked without the model: a count >= 1, or a non-empty list
    of distinct layer indices >= 0 (sorted: the draft runs them in the model's order). ValueError naming it."""
    fix = "give a count of layers >= 1 or a list of distinct layer indices (0 = the first), or leave it out for all"
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"speculative_config: draft_layers={value} keeps no layer; {fix}")
        return value
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"speculative_config: draft_layers must be an integer or a non-empty list, got {value!r}; "
                         f"{fix}")
    if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in value):
        raise ValueError(f"speculative_config: draft_layers {list(value)} holds a non-integer or negative index; {fix}")
    if len(set(value)) != len(value):
        dup = sorted({i for i in value if list(value).count(i) > 1})
        raise ValueError(f"speculative_config: draft_layers {list(value)} names layer(s) {dup} twice; {fix}")
    return tuple(sorted(value))


def kept_layers(draft_layers: int | tuple[int, ...] | None, num_layers: int) -> tuple[int, ...] | None:
    """The decoder layers a draft step runs, in order, for a model of ``num_layers`` (None: every one).
    ValueError naming ``draft_layers`` when it asks for more layers than the model has."""
    if draft_layers is None:
        return None
    if isinstance(draft_layers, int):
        if draft_layers > num_layers:
            raise ValueError(f"speculative_config: draft_layers={draft_layers} keeps more layers than the model's "
                             f"{num_layers}; give at most {num_layers}")
        n = draft_layers  # the first ceil(n/2) layers and the last floor(n/2): the middle skipped
        kept = tuple(range(-(-n // 2))) + tuple(range(num_layers - n // 2, num_layers))
    else:
        if draft_layers[-1] >= num_layers:
            raise ValueError(f"speculative_config: draft_layers {list(draft_layers)} names layer {draft_layers[-1]}, "
                             f"but the model's layers are 0..{num_layers - 1}")
        kept = draft_layers
    return None if len(kept) == num_layers else kept
