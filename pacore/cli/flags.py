"""The flags of ``pacore run`` and ``pacore demo``: the PaCoRe method's, and the engine's (defined once,
beside EngineConfig: engine/config.py) with how the engines are run (replicas, Ray, profiling)."""
from __future__ import annotations

import argparse
import difflib
import math
import sys

from engine.config import add_engine_flags, positive_int, seed_int

from ..config import PRESETS, parse_rounds

# "did you mean": only names this close (difflib's ratio): --max-model-length finds --max-model-len (0.91),
# --generation-confg --generation-config, but --generation-config no longer --speculative-config (0.68).
NEAR_CUTOFF = 0.8


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--max-model`` is no ``--max-model-len``), and an unknown flag is
    named first, by the subcommand it was given to, with the closest flags it has ("did you mean --x?"),
    before anything else is said of the command line (a required flag missing, a bad value)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        commands = getattr(self, "_commands", {})
        command = commands.get(argv[0]) if argv else None
        if command is not None:
            known = option_strings(command)
            unknown = [a for a in argv[1:] if a.startswith("--") and a != "--" and a.partition("=")[0] not in known]
            if unknown:
                command.error(unknown_flags(command, unknown))
        ns, extras = self.parse_known_args(argv, namespace)
        if extras:
            command = commands.get(getattr(ns, "command", None), self)
            command.error(unknown_flags(command, extras))
        return ns


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def unknown_flags(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """The error for arguments ``parser`` does not take: each unknown flag with the nearest ones it has."""
    known = sorted(o for o in option_strings(parser) if o.startswith("--"))
    flags = [arg.partition("=")[0] for arg in extras if arg.startswith("-")]
    if not flags:  # only values: say which (a value after an unknown flag is that flag's, not news)
        return f"unexpected argument(s): {' '.join(extras)}"
    parts = []
    for flag in flags:
        near = difflib.get_close_matches(flag, [k for k in known if _may_be_meant(flag, k)], n=1, cutoff=NEAR_CUTOFF)
        hint = f"did you mean {near[0]}?" if near else f"see {parser.prog} --help"
        parts.append(f"unrecognized flag {flag}: {hint}")
    return "; ".join(parts)


def _may_be_meant(flag: str, known: str) -> bool:
    """Whether ``flag`` may be a misspelling of ``known``: as many words (--max-model-length,
    --max-model-len), or its first words (--max-model). One with a word more names another setting
    (--tokenizer-mode is not --tokenizer), so suggesting it would change what the command does."""
    words, known_words = flag.split("-"), known.split("-")
    return len(words) == len(known_words) or known_words[:len(words)] == words


# Without --model the embedded 135M model runs on a CPU: a budget that fills its 8k context would take long.
EMBEDDED_MODEL_MAX_TOKENS = 512


def _cap(value: str):
    if value == "auto":
        return "auto"
    if value == "none":
        return None
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("expected 'auto', 'none' or a positive integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError("a message token cap must be at least 1")
    return n


def _convert(value: str, kind: type):
    try:
        return kind(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {value!r}") from None


def _finite(value: str) -> float:
    x = _convert(value, float)
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return x


def _sampling(name: str):
    """An argparse type for a sampling flag, checked by the engine's own rule (SamplingParams), so
    a bad value stops the command at once instead of costing a model load and an error per problem."""
    def parse(value: str) -> float:
        from engine.sample.sampling_params import SamplingParams  # torch-free

        x = _finite(value)
        try:
            SamplingParams(**{name: x})
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"SamplingParams.{name} ")) from None
        return x
    return parse


def _seconds(value: str) -> float:
    s = _finite(value)
    if s < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds (0: snapshot only when stopped), got {value}")
    return s


def _rounds(value: str) -> tuple[int, ...]:
    try:
        return parse_rounds(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _max_tokens(value: str):
    if value == "auto":
        return "auto"
    try:
        return positive_int(value)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {value!r}") from None


def _trace_steps(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of steps >= 0, got {value}")
    return n


def apply_threads(threads: int | None) -> None:
    """``--threads``: what OMP_NUM_THREADS=N sets, for this process (torch, if loaded already) and the
    replicas and tensor-parallel ranks it spawns, which split them (engine/parallel/spawn.py). None: torch's
    choice."""
    if not threads:
        return
    import os
    import sys

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    if "torch" in sys.modules:  # read OMP_NUM_THREADS when it loaded: set it directly
        sys.modules["torch"].set_num_threads(threads)


def add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None, metavar="DIR",
                   help="HF model folder (config.json, safetensors, tokenizer); default: the embedded SmolLM2-135M")
    add_engine_flags(g)
    g.add_argument("--data-parallel-size", "--data-parallel", dest="data_parallel", type=positive_int, default=None,
                   metavar="D",
                   help="D engine replicas, each on --tensor-parallel-size GPUs of its own (replica r gets GPUs "
                        "[r*T, (r+1)*T) in CUDA_VISIBLE_DEVICES order), problems handed to whichever has room; "
                        "only this process writes the results; on a CPU host D processes that split the cores, or "
                        "--threads (vLLM's name; --data-parallel is the same flag; default 1; with --ray: the "
                        "cluster's GPUs // T, or one replica per node without GPUs)")
    g.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads torch may use in all, as OMP_NUM_THREADS=N would set (replicas and "
                        "tensor-parallel ranks on a CPU split them); on a CPU shared with other jobs, set it to the "
                        "cores you may use: more threads than free cores makes every step many times slower "
                        "(default: what torch chooses, OMP_NUM_THREADS if set, else one per core)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the replicas as Ray actors (pip install -e '.[ray]'): 'auto', HOST:PORT or "
                        "ray://HOST:PORT joins a running cluster (`ray start` on each node); without ADDRESS a "
                        "local one is started. The model folder must exist at the same path on every node; "
                        "the records stream back here, so no shared filesystem is needed (default: no Ray)")
    g.add_argument("--profile", default=None, metavar="DIR",
                   help="write a per-step timeline (timeline.jsonl: each step's rounds and problems), where the time "
                        "went per round (profile_summary.json) and a KV-sharing plot (kv_blocks.png) of the run to DIR "
                        "(default: no profile)")
    g.add_argument("--profile-traces", type=_trace_steps, default=0, metavar="STEPS",
                   help="with --profile: also a torch.profiler chrome trace of the first STEPS steps of each round "
                        "(trace_<round>.json; tens of MB each, and traced steps run slower; default 0: none)")


def add_method_options(p: argparse.ArgumentParser, *, max_tokens: int | None, preset: str,
                        temperature: float) -> None:
    g = p.add_argument_group("PaCoRe")
    rounds = g.add_mutually_exclusive_group()
    rounds.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="round schedule preset: " + ", ".join(f"{k}={list(v)}" for k, v in PRESETS.items())
                        + f" (default: {preset}); a final K=1 round is always appended")
    rounds.add_argument("--rounds", type=_rounds, default=None, metavar="K1,K2,...",
                        help="trajectories per round, e.g. 32,4; a final K=1 round is always appended (default: --preset's)")
    default = (f"{max_tokens}" if max_tokens else
               f"auto with --model, {EMBEDDED_MODEL_MAX_TOKENS} for the embedded default model")
    g.add_argument("--max-tokens", type=_max_tokens, default=max_tokens, metavar="auto|N",
                   help=f"generation budget of each trajectory: 'auto' gives each request the context minus its "
                   f"prompt, as the paper (references are then cut, ends kept, only to leave a quarter of the "
                   f"context); N must be below the context (default: {default})")
    g.add_argument("--temperature", type=_sampling("temperature"), default=temperature,
                   help=f"sampling temperature (default {temperature}; the paper uses 1.0)")
    g.add_argument("--top-p", type=_sampling("top_p"), default=1.0, help="nucleus sampling threshold (default 1.0, as the paper)")
    g.add_argument("--seed", type=seed_int, default=0,
                   help="run seed; sampling (and with --shuffle seeded, the reference order) derives per problem and round "
                   "from it (default 0)")
    g.add_argument("--message-token-cap", type=_cap, default="auto", metavar="auto|none|N",
                   help="shorten each reference to its last N tokens; 'auto' (default) shortens just enough "
                   "for the round prompt to fit the context (with --max-tokens auto: to leave a quarter of it to "
                   "generate); 'none' never shortens, as the reference pipeline")
    g.add_argument("--shuffle", choices=["official", "seeded"], default="official",
                   help="order of a round's responses, recorded and given as references: 'official' (default) is the "
                   "reference pipeline's (sorted by length, then one fixed Random(42) shuffle), so results compare with "
                   "published ones; 'seeded' shuffles per problem and round from --seed")
    g.add_argument("--runs", type=positive_int, default=1, metavar="R",
                   help="independent runs of each problem, each with its own derived seeds and its own record "
                   "(\"run\": r); the summary gives accuracy as the mean over runs and its std across runs, as the "
                   "paper's pass@1 (64 runs on AIME 2025, HMMT 2025, Apex; default 1)")
    g.add_argument("--pool", type=positive_int, default=None, metavar="M",
                   help="sample M round-1 trajectories once per problem (one request, prompt prefilled once); each "
                   "run draws its K1 from them without replacement, as the paper's evaluation (M=512 there); "
                   "default: every run samples its own")
    g.add_argument("--max-problems-in-flight", type=positive_int, default=64, metavar="N",
                   help="problems with a round in the engine at once (default 64)")
    g.add_argument("--checkpoint-every", type=_seconds, default=300.0, metavar="SECONDS",
                   help="seconds between snapshots of the trajectories in flight, which --resume continues "
                        "(default 300; 0: only when stopped by Ctrl-C or an error)")
    g.add_argument("--record-confidence", action="store_true",
                   help="record each trajectory's mean token log-probability and DeepConf's lowest group "
                   "confidence (top-20 logprobs, windows of 2048 tokens) beside its tokens; with grading, the "
                   "summary relates them to correctness per round (AUROC). Costs one log-softmax (and a top-20) "
                   "per sampled row per step; off by default")
    g.add_argument("--no-grade", action="store_true", help="do not extract or grade answers")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
