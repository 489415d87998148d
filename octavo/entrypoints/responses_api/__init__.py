"""OpenAI's Responses API (``/v1/responses``): see ``route.py``."""
