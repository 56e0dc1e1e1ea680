"""``pacore serve``: its flags and entry point. Imports neither torch nor FastAPI until it runs."""
from __future__ import annotations

import argparse
import os
import sys

SERVE_EXTRA_HINT = "pacore serve needs the serve extra: pip install -e '.[serve]' (fastapi, uvicorn, prometheus-client)"


def add_serve_parser(sub) -> argparse.ArgumentParser:
    """Register ``pacore serve`` on the ``pacore`` subparsers."""
    from pacore.cli import _json_object, _positive, _seed  # the run command's checks, one rule each

    p = sub.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API",
        description="Serve the model over an OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, "
        "/v1/models, /health, /metrics (Prometheus). Needs the serve extra: pip install -e '.[serve]'.")
    p.add_argument("--model", default=None, metavar="PATH|default",
                   help="HF model folder (config.json, safetensors, tokenizer); 'default' or none: the embedded "
                        "SmolLM2-135M-Instruct")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name clients send and /v1/models lists (default: the model folder's name, "
                        "smollm2-135m for the embedded model)")
    p.add_argument("--api-key", default=os.environ.get("PACORE_API_KEY"), metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default: $PACORE_API_KEY, else none)")
    p.add_argument("--max-queue", type=_positive, default=1024, metavar="N",
                   help="generation requests held at once, running or waiting; more get 429 (default 1024)")
    g = p.add_argument_group("engine")
    g.add_argument("--dtype", default=None, help="weights/activations dtype, e.g. float32, bfloat16")
    g.add_argument("--max-model-len", type=_positive, default=None, metavar="N",
                   help="context limit in tokens, prompt + generation (default: the model's)")
    g.add_argument("--rope-scaling", type=_json_object, default=None, metavar="JSON",
                   help="RoPE parameters laid over the checkpoint's (vLLM's --rope-scaling)")
    g.add_argument("--max-num-seqs", type=_positive, default=None, metavar="N",
                   help="most sequences decoded in one step (engine default 256)")
    g.add_argument("--num-kv-blocks", type=_positive, default=None, metavar="N",
                   help="KV-cache size in blocks (default: sized by the engine)")
    g.add_argument("--tensor-parallel", type=_positive, default=1, metavar="T",
                   help="split the model over T GPUs (LLM(tensor_parallel_size=T); default 1)")
    g.add_argument("--batch-invariant", action="store_true",
                   help="a token's logits do not depend on what else is batched (seeded requests reproduce "
                        "exactly whatever runs beside them; slower)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="run decode steps eagerly instead of replaying CUDA graphs (for a GPU setup where capturing fails)")
    g.add_argument("--seed", type=_seed, default=0, help="engine seed for requests without one (default 0)")
    return p


def served_name(model: str | None) -> str:
    if model is None or model == "default":
        return "smollm2-135m"
    return os.path.basename(os.path.normpath(model))


def main(args) -> int:
    """Run ``pacore serve`` until interrupted; returns the exit status."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
    except ImportError as e:
        print(f"pacore: {SERVE_EXTRA_HINT} ({e})", file=sys.stderr)
        return 2
    from engine import LLM

    from .app import create_app

    model = None if args.model in (None, "default") else args.model
    options = {"dtype": args.dtype, "max_model_len": args.max_model_len, "rope_scaling": args.rope_scaling,
               "max_num_seqs": args.max_num_seqs, "num_kv_blocks": args.num_kv_blocks,
               "batch_invariant": args.batch_invariant or None,
               "tensor_parallel_size": args.tensor_parallel if args.tensor_parallel > 1 else None,
               "enforce_eager": args.enforce_eager or None}
    try:
        llm = LLM(model, seed=args.seed, **{k: v for k, v in options.items() if v is not None})
    except (FileNotFoundError, ValueError) as e:  # a bad path or option, said before anything listens
        print(f"pacore: {e}", file=sys.stderr)
        return 2
    with llm:  # stops tensor-parallel workers when the server exits
        app = create_app(llm, args.served_model_name or served_name(args.model), args.api_key, args.max_queue)
        uvicorn.run(app, host=args.host, port=args.port)
    return 0
