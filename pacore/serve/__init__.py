"""``pacore serve``: an OpenAI-compatible HTTP server over the engine (FastAPI + uvicorn).

options.py (flags, entry point; imports nothing heavy), protocol.py (request models and response
bodies), engine_loop.py (the one thread that owns the LLM), text.py (incremental detokenizing for
streams), metrics.py (Prometheus), app.py (the routes), background.py (serve from a thread, for
tests and benchmarks). Install with ``pip install -e '.[serve]'``.
"""
