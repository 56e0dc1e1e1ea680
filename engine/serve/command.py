"""The ``serve`` command: its flags and entry point (``pacore serve`` calls these). Imports neither
torch nor FastAPI until it runs."""
from __future__ import annotations

import argparse
import os
import signal
import sys

from engine.config import ENGINE_FLAGS, add_engine_flags, engine_kwargs, positive_int, seconds
from engine.jsonfile import loads_json

from engine.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS

from . import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_LOGPROB_ENTRIES

SERVE_EXTRA_HINT = "pacore serve needs the serve extra: pip install -e '.[serve]' (fastapi, uvicorn, prometheus-client)"
SERVE_FLAGS = ENGINE_FLAGS + ("seed",)  # the engine seed, for requests without one


def add_serve_parser(sub) -> argparse.ArgumentParser:
    """Register the ``serve`` command on a command line's subparsers."""
    p = sub.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API",
        description="Serve the model over an OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, "
        "/v1/models, /tokenize, /detokenize, /health, /metrics (Prometheus, vLLM's names too). Needs the serve "
        "extra: pip install -e '.[serve]'.")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as in vLLM's `vllm serve MODEL`: the same as --model (default: --model's)")
    p.add_argument("--model", default=None, metavar="PATH|default",
                   help="HF model folder (config.json, safetensors, tokenizer); 'default' or none: the embedded "
                        "SmolLM2-135M-Instruct")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name clients send and /v1/models lists (default: the model folder's name, "
                        "smollm2-135m for the embedded model)")
    p.add_argument("--api-key", default=os.environ.get("PACORE_API_KEY"), metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on the /v1 routes (/health, /metrics, /docs stay open, "
                        "as in vLLM; default: $PACORE_API_KEY, else none; surrounding whitespace is stripped; an "
                        "empty key, or one with characters other than printable ASCII, is refused)")
    p.add_argument("--allowed-origins", type=_origins, default=None, metavar="JSON",
                   help="web origins whose pages may call the API from a browser (CORS), as a JSON list like "
                        "vLLM's, e.g. '[\"http://localhost:3000\"]' (default: none; every POST must be "
                        "Content-Type: application/json, so other pages cannot reach the API)")
    p.add_argument("--max-queue", type=positive_int, default=1024, metavar="N",
                   help="sequences (prompts x n) held at once, running or waiting; a request beyond the limit gets "
                        "429, one that alone exceeds it 400 (default 1024)")
    p.add_argument("--max-body-bytes", type=positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
                   help=f"largest request body; a longer one gets 413 before it is read (default {DEFAULT_MAX_BODY_BYTES})")
    p.add_argument("--max-logprob-entries", type=positive_int, default=DEFAULT_MAX_LOGPROB_ENTRIES,
                   metavar="N",
                   help="most log-probabilities one request's replies may hold: per token with logprobs the chosen "
                        "one and its top alternatives, over every choice and the echoed or asked-for prompt; a "
                        f"request that could exceed it gets 400 (default {DEFAULT_MAX_LOGPROB_ENTRIES})")
    p.add_argument("--max-stop-strings", type=_at_most(MAX_STOP_STRINGS), default=MAX_STOP_STRINGS, metavar="N",
                   help=f"most stop strings one request may send; more get 400 (default {MAX_STOP_STRINGS}, the "
                        "engine's most; OpenAI takes 4)")
    p.add_argument("--max-stop-chars", type=_at_most(MAX_STOP_CHARS), default=MAX_STOP_CHARS, metavar="N",
                   help=f"most characters one request's stop strings may have in all; more get 400 (default "
                        f"{MAX_STOP_CHARS}, the engine's most)")
    p.add_argument("--shutdown-timeout", type=seconds, default=30.0, metavar="S",
                   help="on SIGTERM or Ctrl-C: stop admitting requests, let running ones finish for up to S "
                        "seconds, then abort the rest and exit (default 30)")
    engine = p.add_argument_group("engine")
    add_engine_flags(engine, SERVE_FLAGS)
    engine.add_argument("--data-parallel-size", type=positive_int, default=1, metavar="D",
                        help="vLLM's flag, taken for its command lines: only 1, since a server runs one engine "
                             "(run one server per replica behind a load balancer, or use `pacore run "
                             "--data-parallel-size D`; default 1)")
    return p


def model_of(args) -> str | None:
    """The model ``pacore serve MODEL`` or ``--model`` names (None: the embedded one); ValueError when
    both are given and differ, or --data-parallel-size asks for replicas a server does not run."""
    if args.model_tag is not None and args.model is not None and args.model_tag != args.model:
        raise ValueError(f"two models given: {args.model_tag} (positional) and --model {args.model}; give one")
    if args.data_parallel_size > 1:
        raise ValueError(f"--data-parallel-size {args.data_parallel_size}: pacore serve runs one engine; start "
                         f"one server per replica (behind a load balancer), or use pacore run --data-parallel-size")
    return args.model_tag if args.model_tag is not None else args.model


def _at_most(limit: int):
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"at most {limit} (the engine's limit), got {value}")
        return value
    return parse


def _origins(text: str) -> list[str]:
    try:
        origins = loads_json(text)
    except ValueError:  # bad JSON, or nested too deeply
        origins = None
    if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
        raise argparse.ArgumentTypeError(f"a JSON list of origins, e.g. '[\"http://localhost:3000\"]', got {text!r}")
    return origins


def served_name(model: str | None) -> str:
    if model is None or model == "default":
        return "smollm2-135m"
    return os.path.basename(os.path.normpath(model))


def main(args) -> int:
    """Run the server until interrupted; returns the exit status."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        print(f"pacore: {SERVE_EXTRA_HINT} ({e})", file=sys.stderr)
        return 2
    from engine import LLM

    from .app import create_app
    from .connection import HalfCloseProtocol
    from .front_door import check_api_key

    try:
        check_api_key(args.api_key)  # before the model loads
        args.model = model_of(args)
    except ValueError as e:
        print(f"pacore: {e}", file=sys.stderr)
        return 2

    model = None if args.model in (None, "default") else args.model
    try:
        llm = LLM(model, seed=args.seed, **engine_kwargs(args, ENGINE_FLAGS))
    except (FileNotFoundError, ValueError) as e:  # a bad path or option, said before anything listens
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    name = args.served_model_name or served_name(args.model)
    alias = args.model or "default"  # what it was started with: `--model default` answers "default" too
    print(f"{llm.describe()}; served as {name}" + (f" (or {alias})" if alias != name else ""), file=sys.stderr,
          flush=True)
    with llm:  # stops tensor-parallel workers when the server exits
        app = create_app(llm, name, args.api_key, args.max_queue, args.max_body_bytes, aliases=(alias,),
                         max_logprob_entries=args.max_logprob_entries, max_stop_strings=args.max_stop_strings,
                         max_stop_chars=args.max_stop_chars, allowed_origins=args.allowed_origins)
        # uvicorn drains on SIGTERM (timeout_graceful_shutdown: then it cancels what still runs, and
        # the engine aborts those requests), then raises the signal again for the handler it found:
        # with a no-op one the process leaves through `with llm` and exits 0.
        previous = signal.signal(signal.SIGTERM, lambda *_: None)
        try:
            uvicorn.run(app, host=args.host, port=args.port, http=HalfCloseProtocol,
                        timeout_graceful_shutdown=args.shutdown_timeout)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return 0
