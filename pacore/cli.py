"""Command line: ``pacore run`` over a JSONL file and ``pacore demo`` on the built-in problems."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

from .budget import check_max_tokens
from .config import PRESETS, RunConfig, parse_rounds
from .io import OutputExistsError, prepare_output, same_file
from .lock import ResultsLocked, results_lock
from .runs import validate_runs


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


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
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
        from engine.sampling_params import SamplingParams  # torch-free

        x = _finite(value)
        try:
            SamplingParams(**{name: x})
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"SamplingParams.{name} ")) from None
        return x
    return parse


def _seed(value: str) -> int:
    n = _convert(value, int)
    if not 0 <= n < 2**64:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**64), got {value}")
    return n


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
        return _positive(value)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {value!r}") from None


def _json_object(value: str) -> dict:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}); quote it for the shell, e.g. "
                                         f"'{_YARN_EXAMPLE}'") from None
    if not isinstance(obj, dict) or not obj:
        raise argparse.ArgumentTypeError(f"expected a non-empty JSON object such as '{_YARN_EXAMPLE}', got {value}")
    return obj


_YARN_EXAMPLE = '{"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}'
# Without --model the embedded 135M model runs on a CPU: a budget that fills its 8k context would take long.
_EMBEDDED_MODEL_MAX_TOKENS = 512


def add_llm_flags(g) -> None:
    """The LLM's own options as flags, one definition for pacore run, demo and serve (see llm_options)."""
    g.add_argument("--dtype", default=None, help="weights/activations dtype, e.g. float32, bfloat16 (default: the engine's choice)")
    g.add_argument("--max-model-len", type=_positive, default=None, metavar="N",
                   help="context limit in tokens, prompt + generation (default: the model's); 131072 for "
                        "PaCoRe-8B as in the paper, with --rope-scaling")
    g.add_argument("--rope-scaling", type=_json_object, default=None, metavar="JSON",
                   help="RoPE parameters laid over the checkpoint's (vLLM's --rope-scaling), e.g. the paper's YaRN x2: "
                        "'{\"rope_type\": \"yarn\", \"factor\": 2.0, \"original_max_position_embeddings\": 32768, "
                        "\"attention_factor\": 1.0}'")
    g.add_argument("--max-num-seqs", type=_positive, default=None, metavar="N",
                   help="most sequences (trajectories) decoded in one step (engine default 256)")
    g.add_argument("--num-kv-blocks", type=_positive, default=None, metavar="N",
                   help="KV-cache size in blocks (default: sized by the engine)")
    g.add_argument("--tensor-parallel", type=_positive, default=1, metavar="T",
                   help="split each engine over T GPUs (LLM(tensor_parallel_size=T)); pacore run with "
                        "--data-parallel D uses D x T GPUs (default 1)")
    g.add_argument("--batch-invariant", action="store_true",
                   help="a token's logits do not depend on what else is batched, preemption or a restart, so seeded "
                        "requests and resumed or re-batched runs draw exactly the same tokens (slower; see README "
                        "Guarantees)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="run decode steps eagerly instead of replaying CUDA graphs (vLLM's flag; for a GPU "
                        "setup where capturing fails)")


def llm_options(args) -> dict:
    """``LLM(**options)`` from add_llm_flags' flags; those left unset are the engine's to choose."""
    options = {"dtype": args.dtype, "max_model_len": args.max_model_len, "rope_scaling": args.rope_scaling,
               "max_num_seqs": args.max_num_seqs, "num_kv_blocks": args.num_kv_blocks,
               "batch_invariant": args.batch_invariant or None,
               "tensor_parallel_size": args.tensor_parallel if args.tensor_parallel > 1 else None,
               "enforce_eager": args.enforce_eager or None}
    return {k: v for k, v in options.items() if v is not None}


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None, metavar="DIR",
                   help="HF model folder (config.json, safetensors, tokenizer); default: the embedded SmolLM2-135M")
    add_llm_flags(g)
    g.add_argument("--data-parallel", type=_positive, default=None, metavar="D",
                   help="D engine replicas, each on --tensor-parallel GPUs of its own (replica r gets GPUs "
                        "[r*T, (r+1)*T) in CUDA_VISIBLE_DEVICES order), problems handed to whichever has room; "
                        "only this process writes the results; on a CPU host D processes that split the cores "
                        "(default 1; with --ray: the cluster's GPUs // T, or one replica per node without GPUs)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the replicas as Ray actors (pip install -e '.[ray]'): 'auto', HOST:PORT or "
                        "ray://HOST:PORT joins a running cluster (`ray start` on each node); without ADDRESS a "
                        "local one is started. The model folder must exist at the same path on every node; "
                        "the records stream back here, so no shared filesystem is needed")
    g.add_argument("--profile", default=None, metavar="DIR",
                   help="write a per-step timeline (timeline.jsonl), torch.profiler traces and a KV-sharing "
                        "plot (kv_blocks.png) of the run to DIR")


def _add_method_options(p: argparse.ArgumentParser, *, max_tokens: int | None, preset: str,
                        temperature: float) -> None:
    g = p.add_argument_group("PaCoRe")
    rounds = g.add_mutually_exclusive_group()
    rounds.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="round schedule preset: " + ", ".join(f"{k}={list(v)}" for k, v in PRESETS.items())
                        + f" (default: {preset}); a final K=1 round is always appended")
    rounds.add_argument("--rounds", type=_rounds, default=None, metavar="K1,K2,...",
                        help="trajectories per round, e.g. 32,4; a final K=1 round is always appended")
    default = (f"{max_tokens}" if max_tokens else
               f"auto with --model, {_EMBEDDED_MODEL_MAX_TOKENS} for the embedded default model")
    g.add_argument("--max-tokens", type=_max_tokens, default=max_tokens, metavar="auto|N",
                   help=f"generation budget of each trajectory: 'auto' gives each request the context minus its "
                   f"prompt, as the paper (references are then cut, ends kept, only to leave a quarter of the "
                   f"context); N must be below the context (default: {default})")
    g.add_argument("--temperature", type=_sampling("temperature"), default=temperature,
                   help=f"sampling temperature (default {temperature}; the paper uses 1.0)")
    g.add_argument("--top-p", type=_sampling("top_p"), default=1.0, help="nucleus sampling threshold (default 1.0, as the paper)")
    g.add_argument("--seed", type=_seed, default=0,
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
    g.add_argument("--runs", type=_positive, default=1, metavar="R",
                   help="independent runs of each problem, each with its own derived seeds and its own record "
                   "(\"run\": r); the summary gives accuracy as the mean over runs and its std across runs, as the "
                   "paper's pass@1 (64 runs on AIME 2025, HMMT 2025, Apex; default 1)")
    g.add_argument("--pool", type=_positive, default=None, metavar="M",
                   help="sample M round-1 trajectories once per problem (one request, prompt prefilled once); each "
                   "run draws its K1 from them without replacement, as the paper's evaluation (M=512 there); "
                   "default: every run samples its own")
    g.add_argument("--max-problems-in-flight", type=_positive, default=64, metavar="N",
                   help="problems with a round in the engine at once (default 64)")
    g.add_argument("--checkpoint-every", type=_seconds, default=300.0, metavar="SECONDS",
                   help="seconds between snapshots of the trajectories in flight, which --resume continues "
                        "(default 300; 0: only when stopped by Ctrl-C or an error)")
    g.add_argument("--no-grade", action="store_true", help="do not extract or grade answers")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The ``pacore`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="pacore",
        description="PaCoRe (Parallel Coordinated Reasoning) inference on the PaCoRe Engine.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run PaCoRe over a JSONL file of problems",
        description="Run PaCoRe over a JSONL file ({'id', 'messages', 'ground_truth': {'answer'}} per line). "
        "Results are appended one line per problem as each finishes; a summary is printed and written "
        "to OUT.summary.json.",
    )
    run.add_argument("--data", required=True, metavar="PROBLEMS.jsonl", help="input problems, official PaCoRe JSONL")
    run.add_argument("--out", required=True, metavar="RESULTS.jsonl", help="results JSONL (appended, one line per problem)")
    run.add_argument("--resume", action="store_true",
                     help="skip the problems --out already has a result for and run the rest, including those "
                          "whose earlier tries ended in an error (without it a non-empty --out is refused)")
    run.add_argument("--skip-failed", action="store_true",
                     help="with --resume: also skip problems whose earlier tries all ended in an error")
    _add_method_options(run, max_tokens=None, preset="low", temperature=1.0)
    _add_engine_options(run)

    demo = sub.add_parser(
        "demo",
        help="run the built-in arithmetic problems on the default model and print the summary",
        description="Run a few easy arithmetic word problems with preset 'low' (4 trajectories, then 1) and a "
        "small token budget on the default model, then print the summary.",
    )
    demo.add_argument("--out", default=None, metavar="RESULTS.jsonl",
                      help="results path (default: a new temporary directory)")
    # A 135M model rambles at temperature 1.0; a cooler default makes the demo's answers readable.
    _add_method_options(demo, max_tokens=64, preset="low", temperature=0.7)
    _add_engine_options(demo)
    from .serve.options import add_serve_parser  # here: it reuses this module's flag checks
    serve = add_serve_parser(sub)
    # `pacore --help` documents every option, not just the subcommand names.
    parser.epilog = "\n\n".join(sp.format_help() for sp in (run, demo, serve))
    return parser


def _config(args, data_path: str, out_path: str, resume: bool) -> RunConfig:
    rounds = args.rounds or PRESETS[args.preset or "low"]
    max_tokens = args.max_tokens
    if max_tokens is None:  # the paper's budget for a real model; the embedded one keeps a small one
        max_tokens = "auto" if args.model else _EMBEDDED_MODEL_MAX_TOKENS
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
        max_problems_in_flight=args.max_problems_in_flight,
        message_token_cap=args.message_token_cap,
        shuffle=args.shuffle,
        runs=args.runs,
        pool=args.pool,
        grade=not args.no_grade,
        show_progress=not args.no_progress,
        profile_dir=args.profile,
        checkpoint_every_s=args.checkpoint_every,
        engine_options={k: v for k, v in {"model": args.model, **llm_options(args)}.items() if v is not None},
    )


def build_llm(cfg: RunConfig):
    """The engine for ``cfg`` (imported here so ``pacore --help`` never loads torch)."""
    from engine import LLM

    return LLM(seed=cfg.seed, **cfg.engine_options)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pacore`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from .serve.options import main as serve

        return serve(args)
    if args.command == "run":
        refused = _refused_paths(args)
        if refused:
            print(f"pacore: {refused}", file=sys.stderr)
            return 2
        cfg = _config(args, args.data, args.out, args.resume)
    else:
        from .demo import write_demo_jsonl

        workdir = tempfile.mkdtemp(prefix="pacore_demo_")
        data = os.path.join(workdir, "demo_problems.jsonl")
        write_demo_jsonl(data)
        cfg = _config(args, data, args.out or os.path.join(workdir, "results.jsonl"), resume=False)
    context = cfg.engine_options.get("max_model_len")
    try:  # refused before the model loads (the context, when given, tells whether a budget can fit)
        validate_runs(cfg)
        if context is not None:
            check_max_tokens(cfg.max_tokens, context)
        _check_tensor_parallel(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    try:
        # One run per results file, from the output check to the summary (replicas run under it).
        with results_lock(cfg.out_path):
            # Checked before loading the model, so a refused path costs nothing.
            prepare_output(cfg.out_path, cfg.resume)
            return _run(args, cfg)
    except (OutputExistsError, ResultsLocked) as e:
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _check_tensor_parallel(cfg: RunConfig) -> None:
    """A size that cannot split the model is refused here, not in each replica after it loads."""
    size = cfg.engine_options.get("tensor_parallel_size") or 1
    if size > 1:
        from engine.config import ModelConfig
        from engine.default_model import resolve_model
        from engine.distributed import check_divisible

        check_divisible(ModelConfig.from_pretrained(resolve_model(cfg.engine_options.get("model"))), size)


def _refused_paths(args) -> str | None:
    """Why ``pacore run`` cannot use its paths and flags as given, or None."""
    if os.path.isdir(args.data):
        return f"--data {args.data} is a directory; pass a problems file (JSONL, or a JSON array of problems)"
    if not os.path.isfile(args.data):
        return f"no such input file: {args.data}"
    if os.path.isdir(args.out):
        return f"--out {args.out} is a directory; pass a file path such as {os.path.join(args.out, 'results.jsonl')}"
    if same_file(args.data, args.out):
        return f"--out {args.out} is the input file; results would be appended to the problems. Choose another --out"
    if args.skip_failed and not args.resume:
        return "--skip-failed only applies with --resume"
    return None


def _run(args, cfg: RunConfig) -> int:
    if args.ray is not None or (args.data_parallel or 1) > 1:
        return _run_replicated(cfg, args.data_parallel, args.ray)
    from .runner import run_pacore
    from .session import profiled

    try:
        llm = build_llm(cfg)
    except (ValueError, FileNotFoundError) as e:  # a bad model folder or engine option, said plainly
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    try:
        check_max_tokens(cfg.max_tokens, llm.max_model_len)
    except ValueError as e:
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    with profiled(llm, cfg.profile_dir):
        run_pacore(llm, cfg)
    if cfg.profile_dir:
        print(f"profile: {cfg.profile_dir}")
    return 0


def _run_replicated(cfg: RunConfig, replicas: int | None, ray_address: str | None) -> int:
    from .dispatch import ReplicaError
    from .stats import show_summary

    try:
        if ray_address is None:
            from .parallel import run_data_parallel

            summary = run_data_parallel(cfg, replicas, build_llm)
        else:
            from .ray_replicas import RayMissing, run_on_ray

            try:
                summary = run_on_ray(cfg, build_llm, ray_address, replicas)
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
