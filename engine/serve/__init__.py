"""The engine's OpenAI-compatible HTTP front end (FastAPI + uvicorn), run by ``pacore serve``.

command.py (the ``serve`` command's flags and entry point; imports nothing heavy), protocol.py
(request models and response bodies), front_door.py (the API key, body limit and content type,
before any route reads the body), prompts.py (rendering and tokenizing on a worker thread),
engine_loop.py (the one thread that owns the LLM), text.py (incremental detokenizing for streams),
logprobs.py (log-probabilities in the API's shapes), replies.py (replies rendered off the event loop,
and what one may hold),
metrics.py (Prometheus), app.py (the routes), vllm_only.py (vLLM's request fields missing here, named
in their 422), connection.py (uvicorn run with a drain that fails what it cuts cleanly, and its protocol
answering half-closed clients), background.py (serve from a thread, for tests and benchmarks). It depends on the engine alone (chat templates:
engine/chat.py). Install with ``pip install -e '.[serve]'``.
"""

DEFAULT_MAX_BODY_BYTES = 32 * 2 ** 20  # --max-body-bytes and create_app's: 128k-token prompts as ids are ~1 MB
# --max-logprob-entries: the log-probabilities (a token's, or one of its top alternatives) one request's
# replies may hold. ~60 bytes of JSON each in chat, ~25 in completions: a reply of tens of MB at most.
DEFAULT_MAX_LOGPROB_ENTRIES = 1_000_000
