"""The ``serve`` command: its flags and entry point (``pacore serve`` calls these). Imports neither
torch nor FastAPI until it runs."""
from __future__ import annotations

import argparse
import os
import signal
import sys

from engine.config import ENGINE_FLAGS, add_engine_flags, engine_kwargs, positive_int, seconds
from engine.jsonfile import loads_json

from engine.sample.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS

from . import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_LOGPROB_ENTRIES

SERVE_EXTRA_HINT = "pacore serve needs the serve extra: pip install -e '.[serve]' (fastapi, uvicorn, prometheus-client)"
# The engine seed (for requests without one) and vLLM's engine flags a server is started with
SERVE_FLAGS = ENGINE_FLAGS + ("seed", "tokenizer", "block_size", "max_num_batched_tokens", "enable_prefix_caching")

# vLLM's serve flags that mean nothing different here: accepted, and nothing to do.
NO_OP_FLAGS = {
    "--disable-log-requests": "this server logs no requests",
    "--disable-log-stats": "this server logs no periodic statistics (they are at /metrics)",
    "--enable-chunked-prefill": "prompts are always prefilled in chunks beside decode rows",
    "--trust-remote-code": "no model code is run: Llama, Qwen2 and Qwen3 are this engine's own",
    "--disable-custom-all-reduce": "tensor-parallel ranks all-reduce through torch.distributed, never a custom kernel",
}
# vLLM's serve flags that take a value and mean nothing here: accepted, and named in the start-up line.
NO_OP_VALUE_FLAGS = {
    "--max-log-len": "no prompt is logged",
    "--max-seq-len-to-capture": "CUDA graphs are captured per decode batch size, whatever the sequence length",
}
# vLLM's serve flags this server cannot honour, and why (a refusal names it; see docs/serving.md).
REFUSED_FLAGS = {
    "--pipeline-parallel-size": "there is no pipeline parallelism; use --tensor-parallel-size",
    "--swap-space": "a preempted sequence is recomputed, never swapped to CPU memory",
    "--cpu-offload-gb": "weights are never offloaded to CPU memory",
    "--enable-lora": "LoRA adapters are not supported",
    "--lora-modules": "LoRA adapters are not supported",
    "--enable-auto-tool-choice": "there is no tool calling",
    "--tool-call-parser": "there is no tool calling",
    "--reasoning-parser": "there is no reasoning parser: the text holds the reasoning, as plain vllm serve returns it",
    "--guided-decoding-backend": "there is no structured output",
    "--structured-outputs-config": "there is no structured output",
    "--load-format": "only safetensors checkpoints load",
    "--revision": "models are local folders: nothing is downloaded",
    "--download-dir": "models are local folders: nothing is downloaded",
    "--tokenizer-revision": "tokenizers are local folders: nothing is downloaded",
    "--hf-overrides": "only --max-model-len and --rope-scaling override a checkpoint's config",
    "--scheduling-policy": "requests are scheduled first come, first served (with the fair shares of "
                           "--long-prefill-token-threshold and --max-num-seqs-per-request)",
    "--distributed-executor-backend": "tensor-parallel ranks are processes the engine starts itself",
    "--task": "this engine generates text only",
    "--runner": "this engine generates text only",
    "--limit-mm-per-prompt": "this engine takes text only",
    "--max-lora-rank": "LoRA adapters are not supported",
}


class _Refused(argparse.Action):
    """A vLLM flag this server does not take: the command stops, naming it and why."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is vLLM's flag, not taken here: {REFUSED_FLAGS[option_string]}")


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
    engine.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                        help="the chat template to render chat requests with: a Jinja file, or the template itself "
                             "(vLLM's flag; default: the tokenizer's)")
    engine.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                        help="where a request's default sampling values come from (vLLM's flag and default): auto "
                             "reads the model folder's generation_config.json (temperature, top_p, top_k, min_p, "
                             "repetition_penalty), DIR another folder's, vllm none "
                             "(OpenAI's defaults); a request's own values always win")
    p.add_argument("--uvicorn-log-level", default="info", choices=("critical", "error", "warning", "info", "debug",
                                                                    "trace"),
                   help="uvicorn's log level (vLLM's flag; default info)")
    p.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="no line per HTTP request in the log (vLLM's flag; default: a line per request)")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage says how many prompt tokens the prefix cache held: prompt_tokens_details.cached_tokens "
                        "(vLLM's flag; default: prompt_tokens_details null)")
    vllm = p.add_argument_group("vLLM's flags taken for its command lines (nothing to do here; the start-up line "
                                "names those given)")
    for flag, why in NO_OP_FLAGS.items():
        vllm.add_argument(flag, action="store_true", help=f"accepted: {why}")
    for flag, why in NO_OP_VALUE_FLAGS.items():
        vllm.add_argument(flag, default=None, metavar="N", help=f"accepted: {why} (default: none)")
    refused = p.add_argument_group("vLLM's flags refused, each naming why")
    for flag, why in REFUSED_FLAGS.items():
        refused.add_argument(flag, action=_Refused, help=why)
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


def generation_defaults(choice: str, model: str | None) -> dict:
    """The sampling defaults ``--generation-config`` names (vLLM's keys): from the model folder's
    generation_config.json (auto), another folder's, or none (vllm). ValueError for a folder without one."""
    from engine.default_model import resolve_model
    from engine.jsonfile import read_json

    if choice == "vllm":
        return {}
    folder = choice
    if choice == "auto":
        try:
            folder = resolve_model(None if model in (None, "default") else model)
        except (FileNotFoundError, ValueError):
            return {}  # the engine says what is wrong with the model as it loads it
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        if choice == "auto":
            return {}
        raise ValueError(f"--generation-config {choice}: no generation_config.json there; give a folder that has "
                         "one, 'auto' (the model's) or 'vllm' (none)")
    config = read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: must be a JSON object of generation settings; fix it, or pass --generation-config "
                         "vllm to use none")
    defaults = {k: config[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
                if config.get(k) is not None}
    return defaults


def chat_template(value: str) -> str:
    """``--chat-template``: a file's text, or the value itself when no such file exists (vLLM's rule)."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise ValueError(f"--chat-template {value}: no such file, and no Jinja template either (it has no '{{'); "
                         "give a template file or the template itself")
    return value


def no_ops_given(args) -> str:
    """The start-up line's note of the vLLM flags given that do nothing here, each with why ("" if none)."""
    given = [f"{flag} ({why})" for flag, why in {**NO_OP_FLAGS, **NO_OP_VALUE_FLAGS}.items()
             if getattr(args, flag[2:].replace("-", "_"), None) not in (None, False)]
    return f"; vLLM's flags taken without effect: {', '.join(given)}" if given else ""


def served_name(model: str | None) -> str:
    if model is None or model == "default":
        return "smollm2-135m"
    return os.path.basename(os.path.normpath(model))


def main(args) -> int:
    """Run the server until interrupted; returns the exit status."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(f"pacore: {SERVE_EXTRA_HINT} ({e})", file=sys.stderr)
        return 2
    from engine import LLM

    from . import connection
    from .app import create_app
    from .front_door import check_api_key

    try:
        check_api_key(args.api_key)  # before the model loads
        args.model = model_of(args)
        defaults = generation_defaults(args.generation_config, args.model)
        template = chat_template(args.chat_template) if args.chat_template is not None else None
    except ValueError as e:
        print(f"pacore: {e}", file=sys.stderr)
        return 2

    model = None if args.model in (None, "default") else args.model
    try:
        llm = LLM(model, seed=args.seed, **engine_kwargs(args, tuple(f for f in SERVE_FLAGS if f != "seed")))
    except (FileNotFoundError, ValueError) as e:  # a bad path or option, said before anything listens
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    if template is not None:
        if llm.tokenizer is None:
            print("pacore: --chat-template needs a tokenizer", file=sys.stderr)
            return 2
        llm.tokenizer.chat_template = template
    if defaults:  # vLLM says this too
        print(f"pacore: default sampling values from --generation-config {args.generation_config}: {defaults} "
              "(a request's own values win; --generation-config vllm for none)", file=sys.stderr)
    name = args.served_model_name or served_name(args.model)
    alias = args.model or "default"  # what it was started with: `--model default` answers "default" too
    print(f"{llm.describe()}; served as {name}" + (f" (or {alias})" if alias != name else "") + no_ops_given(args),
          file=sys.stderr, flush=True)
    with llm:  # stops tensor-parallel workers when the server exits
        app = create_app(llm, name, args.api_key, args.max_queue, args.max_body_bytes, aliases=(alias,),
                         max_logprob_entries=args.max_logprob_entries, max_stop_strings=args.max_stop_strings,
                         max_stop_chars=args.max_stop_chars, allowed_origins=args.allowed_origins,
                         sampling_defaults=defaults, prompt_tokens_details=args.enable_prompt_tokens_details)
        # uvicorn drains on SIGTERM (connection.serve), then raises the signal again for the handler
        # it found: with a no-op one the process leaves through `with llm` and exits 0.
        previous = signal.signal(signal.SIGTERM, lambda *_: None)
        try:
            connection.serve(app, args.shutdown_timeout, args.host, args.port, log_level=args.uvicorn_log_level,
                             access_log=not args.disable_uvicorn_access_log)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return 0
