"""The OpenAI-compatible HTTP server (FastAPI): ``build_app`` in ``app.py``."""
