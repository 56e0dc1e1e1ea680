"""The ``pacore`` command: ``run`` over a JSONL file, ``demo`` on the built-in problems, and ``serve``
(the engine's OpenAI-compatible server, engine/serve/). Importing this loads neither torch nor the
engine: ``pacore --help`` answers at once.

flags.py (the parser, without abbreviations and naming an unknown flag first, and the flags of run and
demo; the engine's come from engine/config.py), run.py (the RunConfig,
the preflight, one engine or its replicas), demo.py (the built-in problems).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile


def build_parser() -> argparse.ArgumentParser:
    """The ``pacore`` argument parser."""
    from engine.serve.command import add_serve_parser

    from .flags import Parser, add_engine_options, add_method_options

    parser = Parser(
        prog="pacore",
        description="PaCoRe (Parallel Coordinated Reasoning) inference on the PaCoRe Engine.",
        epilog="`pacore COMMAND --help` lists a command's flags, each with its default.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

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
    run.add_argument("--override-settings", action="store_true",
                     help="with --resume: continue although settings that change results (--model, --dtype, "
                          "--kv-cache-dtype, --max-model-len, --rope-scaling, --preset/--rounds, --pool, "
                          "--temperature, --top-p, --seed, --max-tokens, --message-token-cap, --shuffle, --no-grade) "
                          "differ from those recorded in RESULTS.jsonl.settings.json, or that file cannot be read; "
                          "the change is recorded there (without it such a resume is refused)")
    add_method_options(run, max_tokens=None, preset="low", temperature=1.0)
    add_engine_options(run)

    demo = sub.add_parser(
        "demo",
        help="run the built-in arithmetic problems on the default model and print the summary",
        description="Run a few easy arithmetic word problems with preset 'low' (4 trajectories, then 1) and a "
        "small token budget on the default model, then print the summary.",
    )
    demo.add_argument("--out", default=None, metavar="RESULTS.jsonl",
                      help="results path (default: a new temporary directory)")
    # A 135M model rambles at temperature 1.0; a cooler default makes the demo's answers readable.
    add_method_options(demo, max_tokens=64, preset="low", temperature=0.7)
    add_engine_options(demo)
    add_serve_parser(sub)
    parser._commands = sub.choices
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pacore`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command != "serve":
        from .flags import apply_threads

        apply_threads(args.threads)
    if args.command == "serve":
        from engine.serve.command import main as serve

        return serve(args)
    from .run import _config, run

    try:
        if args.command == "run":
            cfg = _config(args, args.data, args.out, args.resume)
        else:
            from .demo import write_demo_jsonl

            workdir = tempfile.mkdtemp(prefix="pacore_demo_")
            data = os.path.join(workdir, "demo_problems.jsonl")
            write_demo_jsonl(data)
            cfg = _config(args, data, args.out or os.path.join(workdir, "results.jsonl"), resume=False)
    except ValueError as e:  # flags that cannot work together (RunConfig), said before anything loads
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    return run(args, cfg)



def __getattr__(name: str):
    # build_llm (cli/run.py) needs the engine's flags; `import pacore.cli` must load no engine module.
    if name == "build_llm":
        from .run import build_llm
        return build_llm
    raise AttributeError(f"module 'pacore.cli' has no attribute {name!r}")
