"""The engine's OpenAI-compatible HTTP front end (FastAPI + uvicorn), run by ``pacore serve``.

command.py (the ``serve`` command's flags and entry point; imports nothing heavy), protocol.py
(request models and response bodies), engine_loop.py (the one thread that owns the LLM), text.py
(incremental detokenizing for streams), metrics.py (Prometheus), app.py (the routes), background.py
(serve from a thread, for tests and benchmarks). It depends on the engine alone (chat templates:
engine/chat.py). Install with ``pip install -e '.[serve]'``.
"""
