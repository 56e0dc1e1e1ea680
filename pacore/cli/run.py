"""``pacore run`` and ``pacore demo`` once parsed: the RunConfig, the one preflight, then one engine or
replicas of it."""
from __future__ import annotations

import os
import stat
import sys

from engine.config import engine_kwargs

from ..config import PRESETS, RunConfig
from ..evaluate.runs import validate_runs
from ..results.files import WriteFailed, same_file
from ..results.lock import OutputUnusable, ResultsLocked
from ..results.preflight import Pending, SettingsRefused, preflight
from ..results.resume import OutputExistsError
from ..results.settings import SettingsChanged
from .flags import EMBEDDED_MODEL_MAX_TOKENS


def _config(args, data_path: str, out_path: str, resume: bool) -> RunConfig:
    rounds = args.rounds or PRESETS[args.preset or "low"]
    max_tokens = args.max_tokens
    if max_tokens is None:  # the paper's budget for a real model; the embedded one keeps a small one
        max_tokens = "auto" if args.model else EMBEDDED_MODEL_MAX_TOKENS
    return RunConfig(
        data_path=data_path,
        out_path=out_path,
        rounds=tuple(rounds),
        max_tokens=max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        resume=resume,
        skip_failed=getattr(args, "skip_failed", False),  # `pacore demo` has no such flag
        override_settings=getattr(args, "override_settings", False),
        max_problems_in_flight=args.max_problems_in_flight,
        message_token_cap=args.message_token_cap,
        shuffle=args.shuffle,
        runs=args.runs,
        pool=args.pool,
        grade=not args.no_grade,
        record_confidence=args.record_confidence,
        show_progress=not args.no_progress,
        profile_dir=args.profile,
        profile_trace_steps=args.profile_traces,
        checkpoint_every_s=args.checkpoint_every,
        engine_options={**({"model": args.model} if args.model is not None else {}), **engine_kwargs(args)},
    )


def build_llm(cfg: RunConfig):
    """The engine for ``cfg`` (imported here so ``pacore --help`` never loads torch)."""
    from engine import LLM

    llm = LLM(seed=cfg.seed, **cfg.engine_options)
    print(llm.describe(), file=sys.stderr, flush=True)  # the one start-up line: model, KV cache, context
    return llm


def refused_paths(args) -> str | None:
    """Why ``pacore run`` cannot use its paths and flags as given, or None."""
    try:
        mode = os.stat(args.data).st_mode
    except FileNotFoundError:
        return f"no such input file: {args.data}"
    except OSError as e:
        return f"cannot read --data {args.data}: {e.strerror}"
    if stat.S_ISDIR(mode):
        return f"--data {args.data} is a directory; pass a problems file (JSONL, or a JSON array of problems)"
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # a pipe (<(...), mkfifo) is read once, whole
        kind = "character device" if stat.S_ISCHR(mode) else "block device" if stat.S_ISBLK(mode) else "socket"
        return (f"--data {args.data} is a {kind}, not a problems file; pass a file, or pipe one in "
                f"(--data <(cat problems.jsonl))")
    if os.path.isdir(args.out):
        return f"--out {args.out} is a directory; pass a file path such as {os.path.join(args.out, 'results.jsonl')}"
    if same_file(args.data, args.out):
        return f"--out {args.out} is the input file; results would be appended to the problems. Choose another --out"
    if args.skip_failed and not args.resume:
        return "--skip-failed only applies with --resume"
    if args.override_settings and not args.resume:
        return "--override-settings only applies with --resume"
    return None


def run(args, cfg: RunConfig) -> int:
    """Check, then run ``cfg``; returns the exit status. Everything that can be refused is refused before
    a model loads: --runs/--pool, the model's config (its context, whether --tensor-parallel splits it),
    then, in the one preflight, the budget against that context, the results lock and path."""
    try:
        validate_runs(cfg)  # flags alone: said before the model is looked for
        context = _model_context(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as e:  # no such model, or a size that cannot split it
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    try:
        with preflight(cfg, context) as pending:  # one run per results file, until the summary is written
            if args.ray is not None or (args.data_parallel or 1) > 1:
                return _run_replicated(cfg, pending, args.data_parallel, args.ray)
            return _run_one(cfg, pending)
    except (SettingsRefused, SettingsChanged, OutputExistsError, ResultsLocked, OutputUnusable) as e:
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    except WriteFailed as e:  # a full disk: what was written before stays whole
        print(f"pacore: {e}. What finished before is saved in {cfg.out_path}; free space on its disk, then run "
              f"again with --resume to complete the rest", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _model_context(cfg: RunConfig) -> int:
    """The engine's context (the flag, else the checkpoint's), read from its config.json before any
    model loads; a tensor-parallel size that cannot split the model is refused here too, not in each
    replica after it loads."""
    from engine.config import ModelConfig
    from engine.default_model import resolve_model
    from engine.distributed import check_divisible

    engine = cfg.engine
    model = ModelConfig.from_pretrained(resolve_model(engine.model), rope_scaling=engine.rope_scaling)
    if engine.tensor_parallel_size > 1:
        check_divisible(model, engine.tensor_parallel_size)
    return engine.max_model_len or model.max_position_embeddings


def _run_one(cfg: RunConfig, pending: Pending) -> int:
    from engine.profiler import profiled

    from ..runner import run_pacore

    try:
        llm = build_llm(cfg)
    except (ValueError, FileNotFoundError) as e:  # a bad model folder or engine option, said plainly
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    with profiled(llm, cfg.profile_dir, cfg.profile_trace_steps):
        run_pacore(llm, cfg, pending=pending)
    if cfg.profile_dir:
        print(f"profile: {cfg.profile_dir}")
    return 0


def _run_replicated(cfg: RunConfig, pending: Pending, replicas: int | None, ray_address: str | None) -> int:
    from ..evaluate.summary import show_summary
    from ..replicas.driver import ReplicaError

    try:
        if ray_address is None:
            from ..replicas.processes import run_data_parallel

            summary = run_data_parallel(cfg, replicas, build_llm, pending=pending)
        else:
            from ..replicas.ray_actors import RayMissing, run_on_ray

            try:
                summary = run_on_ray(cfg, build_llm, ray_address, replicas, pending=pending)
            except RayMissing as e:
                print(f"pacore: {e}", file=sys.stderr)
                return 2
    except ReplicaError as e:
        print(f"pacore: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # more replicas (x tensor-parallel) than GPUs
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    show_summary(summary, cfg)
    if cfg.profile_dir:
        print(f"profile: {cfg.profile_dir}/replica*")
    return 0
