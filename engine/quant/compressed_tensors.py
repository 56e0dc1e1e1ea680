"""compressed-tensors FP8 checkpoints (llm-compressor's "FP8-dynamic" releases), read as this engine's own
per-channel FP8 layout.

Such a checkpoint's config.json has ``quantization_config.quant_method: "compressed-tensors"`` with one
config group targeting ``Linear``: e4m3 weights (``type: float``, 8 bits, symmetric) with a static
``channel`` (or ``tensor``) scale, stored as ``*.weight`` (F8_E4M3) and ``*.weight_scale`` ([out, 1] per
channel), and dynamic per-token activations (``input_activations``: ``dynamic: true``, ``strategy:
token``), which is exactly what Fp8Linear computes. ``ignore`` lists the modules left unquantized
(``lm_head`` always; ``re:`` entries are regular expressions). Anything else (int weights, static or
missing activation scales, groups, blocks, several differing groups) is refused naming the key.
"""
from __future__ import annotations

FORMATS = ("float-quantized", "naive-quantized")  # both store the e4m3 values themselves


def _field(scheme: dict, key: str, want, where: str, what: str, way_out: str) -> None:
    got = scheme.get(key)
    if got not in (want if isinstance(want, tuple) else (want,)):
        raise ValueError(f"{where}: quantization_config {what}.{key} is {got!r}; this engine runs compressed-tensors "
                         f"FP8-dynamic checkpoints ({what}.{key} {want!r}); {way_out}")


def compressed_tensors_ignore(qc: dict, where, way_out: str) -> tuple[str, ...]:
    """A compressed-tensors ``quantization_config`` checked (module docstring): the modules it leaves
    unquantized; ValueError naming the key and ``way_out`` for what is not FP8-dynamic."""
    fmt = qc.get("format", "float-quantized")
    if fmt not in FORMATS:
        raise ValueError(f"{where}: quantization_config.format {fmt!r} is not supported (only {list(FORMATS)}, the FP8 "
                         f"formats); {way_out}")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
        raise ValueError(f"{where}: quantization_config.config_groups must be an object of schemes, each an object "
                         f"({{\"group_0\": {{\"targets\": [\"Linear\"], \"weights\": {{...}}}}}}), got {groups!r}; "
                         f"{way_out}")
    groups = list(groups.values())
    if not groups or any(g != groups[0] for g in groups[1:]):
        raise ValueError(f"{where}: quantization_config.config_groups must hold one scheme (or identical ones) for "
                         f"every Linear, got {len(groups)} differing; {way_out}")
    group = groups[0]
    if group.get("targets") != ["Linear"]:
        raise ValueError(f"{where}: quantization_config targets {group.get('targets')!r}; only ['Linear'] (every "
                         f"projection) is supported; {way_out}")
    weights, acts = group.get("weights") or {}, group.get("input_activations")
    if acts is None:
        raise ValueError(f"{where}: quantization_config has no input_activations (weight-only); this engine quantizes "
                         f"activations per token (FP8-dynamic); {way_out}")
    for scheme, what in ((weights, "weights"), (acts, "input_activations")):
        if not isinstance(scheme, dict):
            raise ValueError(f"{where}: quantization_config {what} must be an object (num_bits, type, strategy, ...), "
                             f"got {scheme!r}; {way_out}")
    for scheme, what in ((weights, "weights"), (acts, "input_activations")):
        for key, want in (("type", "float"), ("num_bits", 8), ("symmetric", True), ("group_size", None),
                          ("block_structure", None)):
            _field(scheme, key, want, where, what, way_out)
    _field(weights, "strategy", ("channel", "tensor"), where, "weights", way_out)
    _field(weights, "dynamic", False, where, "weights", way_out)
    _field(acts, "strategy", "token", where, "input_activations", way_out)
    _field(acts, "dynamic", True, where, "input_activations", way_out)
    if group.get("output_activations") is not None:
        raise ValueError(f"{where}: quantization_config output_activations are not supported; {way_out}")
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise ValueError(f"{where}: quantization_config.ignore must be a list of module names, got {ignore!r}")
    return tuple(ignore)
