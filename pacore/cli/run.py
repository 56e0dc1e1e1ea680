"""``pacore run`` and ``pacore demo`` once parsed: the RunConfig, the one preflight (results/preflight.py),
then one engine or replicas of it, and the exit status."""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from engine.config import engine_kwargs

from ..config import PRESETS, RunConfig
from ..evaluate.summary import show_summary, write_summary
from ..results.files import OutputGone, WriteFailed
from ..results.preflight import REFUSALS, Interrupted, Pending, preflight, stopped_early
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


def run(args, cfg: RunConfig) -> int:
    """Check, then run ``cfg``; returns the exit status: 0 when every problem completed, 1 when some ended
    in an error (the count in the last line), 2 for a refusal, 128 + N when stopped by signal N (Ctrl-C,
    SIGTERM, SIGHUP: each snapshots what is in flight and writes the summary first).
    Everything that can be refused is refused in the one preflight before a model loads
    (results/preflight.py), the model's config read there for its context."""
    with _signals_as_ctrl_c() as caught:
        try:
            with preflight(cfg, lambda: _model_context(cfg)) as pending:  # the lock held until the summary is written
                try:
                    summary = _run_pending(args, cfg, pending)
                except WriteFailed as e:  # the output removed after its last record: not a full disk
                    real = os.path.realpath(cfg.out_path)
                    raise (OutputGone(real, e) if not os.path.exists(real) else e) from None
        except (*REFUSALS, _Failed) as e:
            print(f"pacore: {e}", file=sys.stderr)
            return e.status if isinstance(e, _Failed) else 2
        except OutputGone as e:  # the output (or its folder) deleted mid-run
            print(f"pacore: {e}; run again to compute it anew", file=sys.stderr)
            return 2
        except WriteFailed as e:  # a full disk: what was written before stays whole
            print(f"pacore: {e}. What finished before is saved in {cfg.out_path}; free space on its disk, then run "
                  f"again with --resume to complete the rest", file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:
            if not isinstance(e, Interrupted):  # before the run loop said what is saved: loading the model
                print(stopped_early(cfg.out_path), file=sys.stderr)
            return 128 + (caught[0] if caught else signal.SIGINT)
    return _status(summary, cfg)


def _run_pending(args, cfg: RunConfig, pending: Pending) -> dict:
    """Run what the preflight found to do, on one engine or replicas; returns the summary."""
    if not pending.todo:  # a resume with nothing left: no model to load
        print(f"pacore: nothing left to run in {cfg.out_path}", file=sys.stderr)
        summary = write_summary(cfg, 0.0, [])
        show_summary(summary, cfg)
        return summary
    if args.ray is not None or (args.data_parallel or 1) > 1:
        return _run_replicated(cfg, pending, args.data_parallel, args.ray)
    return _run_one(cfg, pending)


class _Failed(Exception):
    """A run that could not start or go on (a model that fails to load, a replica lost): said, its status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _status(summary: dict, cfg: RunConfig) -> int:
    """0 when every problem completed; 1 (after everything is written) when some ended in an error, said
    last so a batch script's log ends with it."""
    errors = summary.get("errors", 0)
    if not errors:
        return 0
    what = "problem runs" if cfg.runs > 1 else "problems"
    if errors == 1:
        what = what[:-1]
    print(f"pacore: {errors} {what} ended in an error (their records are in {cfg.out_path}; run again with "
          f"--resume to retry them)", file=sys.stderr)
    return 1


@contextmanager
def _signals_as_ctrl_c() -> Iterator[list[int]]:
    """While inside, SIGTERM (timeout, systemd, Docker, Slurm) and SIGHUP (a closed terminal) stop the run
    as Ctrl-C does: through the SIGINT handler in place (a replicated run's driver has its own), else a
    KeyboardInterrupt. One the process ignores (SIGHUP under nohup) stays ignored. The yielded list holds
    the signal caught; a second one is not acted on while the first is being handled (the snapshot and
    the summary are written)."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def stop(signum, frame):
        if caught:
            return
        caught.append(signum)
        on_int = signal.getsignal(signal.SIGINT)
        if callable(on_int) and on_int is not signal.default_int_handler:
            on_int(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    hook = sys.unraisablehook

    def redeliver(unraisable):
        # A signal landing while a finalizer (__del__, a weakref callback) runs raises there, and Python
        # prints what a finalizer raises and drops it: the stop would be lost. Send it again instead, from
        # another thread a moment later, so that it is handled outside the finalizer and this hook.
        if unraisable.exc_type is KeyboardInterrupt and caught:
            threading.Timer(0.05, os.kill, (os.getpid(), caught.pop())).start()
        else:
            hook(unraisable)

    # one ignored stays ignored (SIGHUP under nohup)
    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)
           if signal.getsignal(sig) is not signal.SIG_IGN}
    sys.unraisablehook = redeliver
    try:
        yield caught
    finally:
        sys.unraisablehook = hook
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _model_context(cfg: RunConfig) -> int:
    """The engine's context (the flag, else the checkpoint's), read from its config.json before any
    model loads; a tensor-parallel size that cannot split the model is refused here too, not in each
    replica after it loads."""
    from engine.config import ModelConfig
    from engine.default_model import resolve_model
    from engine.parallel.distributed import check_divisible

    engine = cfg.engine
    model = ModelConfig.from_pretrained(resolve_model(engine.model), rope_scaling=engine.rope_scaling)
    if engine.tensor_parallel_size > 1:
        check_divisible(model, engine.tensor_parallel_size)
    return engine.max_model_len or model.max_position_embeddings


def _run_one(cfg: RunConfig, pending: Pending) -> dict:
    from engine.profiler import profiled

    from ..runner import run_pacore

    try:
        llm = build_llm(cfg)
    except (ValueError, FileNotFoundError) as e:  # a bad model folder or engine option, said plainly
        raise _Failed(str(e), 2) from None
    with profiled(llm, cfg.profile_dir, cfg.profile_trace_steps):
        summary = run_pacore(llm, cfg, pending=pending)
    if cfg.profile_dir:
        print(f"profile: {cfg.profile_dir}")
    return summary


def _run_replicated(cfg: RunConfig, pending: Pending, replicas: int | None, ray_address: str | None) -> dict:
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
                raise _Failed(str(e), 2) from None
    except ReplicaError as e:
        raise _Failed(str(e), 1) from None
    except ValueError as e:  # more replicas (x tensor-parallel) than GPUs
        raise _Failed(str(e), 2) from None
    show_summary(summary, cfg)
    if cfg.profile_dir:
        print(f"profile: {cfg.profile_dir}/replica*")
    return summary
