"""What a rehearsal refuses before it runs: a parameter or a device figure that would make its tables
nan, negative or zeros, a modelled cache this CPU cannot hold, a replay file that lacks the problems.
Each is a ``Refused`` naming the flag, the figure or the replay entry, said in one line (exit 2)."""
from __future__ import annotations

import argparse
import math

from engine.device_model import DeviceParams, kv_tokens

BLOCK_SIZE = 16  # the engine's default, which a rehearsal keeps
MAX_KV_TOKENS = 1 << 24  # --max-kv-tokens: the block manager keeps a few list entries per block, in CPU memory


class Refused(ValueError):
    """A rehearsal that cannot give a meaningful table, said before it runs."""


def positive_number(value: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value!r}")
    return x


def probability(value: str) -> float:
    """argparse type: a number in [0, 1]."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1], got {value!r}")
    return x


def context(args, shapes: dict) -> int:
    """The rehearsal's context: --max-model-len, else the shape's."""
    return args.max_model_len or shapes[args.shape]["max_position_embeddings"]


def check_args(args, shapes: dict, mean_tokens: float) -> DeviceParams:
    """The device ``--device`` names, once the flags that depend on each other are checked
    (``mean_tokens``: --mean-tokens, or the preset's default)."""
    try:
        device = DeviceParams.named(args.device)
    except ValueError as e:
        raise Refused(f"--device: {e}") from None
    n = context(args, shapes)
    if args.prompt_tokens >= n:
        raise Refused(f"--prompt-tokens {args.prompt_tokens} leaves no room to generate in a context of {n} tokens "
                      f"(--max-model-len, or the shape's); lower --prompt-tokens or raise --max-model-len")
    if not args.replay and mean_tokens >= n:
        given = f"--mean-tokens {mean_tokens:g}" if args.mean_tokens else f"--preset {args.preset}'s mean of {mean_tokens:g} tokens"
        raise Refused(f"{given} cannot be the mean of trajectories capped at a context of {n} tokens (--max-model-len, "
                      f"or the shape's); pass a lower --mean-tokens or raise --max-model-len")
    return device


def check_cache(args, shapes: dict, folder, options: dict, device: DeviceParams) -> None:
    """The cache the rehearsal models (--kv-tokens, else what the device's memory leaves) must hold one
    whole context (every trajectory may grow to it) and at most --max-kv-tokens."""
    import torch

    from engine.config import ModelConfig
    from engine.worker.kv_cache import resolve_kv_dtype
    from engine.core.step_shape import ModelShape

    if args.kv_tokens:
        tokens, source = args.kv_tokens // BLOCK_SIZE * BLOCK_SIZE, f"--kv-tokens, in blocks of {BLOCK_SIZE}"
    else:
        kv = resolve_kv_dtype(options.get("kv_cache_dtype", "auto"), torch.bfloat16)
        shape = ModelShape.from_config(ModelConfig.from_pretrained(folder, quantization=options.get("quantization")),
                                       torch.bfloat16.itemsize, kv.itemsize)
        tokens = kv_tokens(shape, device)
        source = f"the memory of --device {args.device} (memory_bytes={device.memory_bytes:g}) after the weights"
    if tokens > args.max_kv_tokens:
        raise Refused(f"the modelled KV cache would hold {tokens:,} tokens ({source}), beyond --max-kv-tokens="
                      f"{args.max_kv_tokens:,} (its bookkeeping lives in this CPU's memory); model a smaller cache "
                      f"with --kv-tokens, or raise --max-kv-tokens")
    n = context(args, shapes)
    if tokens < n:
        raise Refused(f"the modelled KV cache holds {tokens:,} tokens ({source}), less than one context of {n:,}: a "
                      f"trajectory that grows to it could never run; raise --kv-tokens or lower --max-model-len")


def replayed_problems(replay, problems: int | None, preset: str, rounds: tuple[int, ...], path: str) -> list[str]:
    """The problems a replay rehearses: the first ``problems`` (None: all) whose run 0 the results file
    recorded in full, in its order, each holding every trajectory the rehearsal will ask for (each
    round's K, then the final round's one)."""
    recorded = list(replay.problems)
    held = ", ".join(recorded[:5]) + (", ..." if len(recorded) > 5 else "")
    if not recorded:
        raise Refused(f"--replay {path} records no problem's run 0 in full (only error records, or none): "
                      f"nothing to replay")
    if problems and problems > len(recorded):
        raise Refused(f"--replay {path} records {len(recorded)} of the {problems} problems --problems asks for "
                      f"({held}); lower --problems, or leave it out to replay them all")
    schedule = (*rounds, 1)
    ids = recorded[:problems] if problems else recorded
    for pid in ids:
        for r, k in enumerate(schedule, start=1):
            for index in range(k):
                if (pid, 0, r, index) not in replay.table:
                    raise Refused(f"--replay {path} has no trajectory for problem {pid} round {r} index {index} (it "
                                  f"recorded rounds of K={list(replay.problems[pid])}); replay with the --preset the "
                                  f"run used (--preset {preset} is K={list(schedule)}), a run whose round 1 was not "
                                  f"drawn from a --pool")
    return ids
