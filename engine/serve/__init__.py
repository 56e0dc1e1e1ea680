"""The engine's OpenAI-compatible HTTP front end (FastAPI + uvicorn), run by ``pacore serve``.

command.py (the ``serve`` command's flags and entry point; imports nothing heavy), protocol.py
(request models and response bodies), front_door.py (the API key, body limit and content type,
before any route reads the body), prompts.py (rendering and tokenizing on a worker thread),
engine_loop.py (the one thread that owns the LLM), text.py (incremental detokenizing for streams),
logprobs.py (log-probabilities in the API's shapes),
metrics.py (Prometheus), app.py (the routes), connection.py (uvicorn's protocol, answering
half-closed clients), background.py (serve from a thread, for tests and benchmarks). It depends on the engine alone (chat templates:
engine/chat.py). Install with ``pip install -e '.[serve]'``.
"""

DEFAULT_MAX_BODY_BYTES = 32 * 2 ** 20  # --max-body-bytes and create_app's: 128k-token prompts as ids are ~1 MB
