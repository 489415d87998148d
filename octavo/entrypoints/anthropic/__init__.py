"""The Anthropic Messages API (``POST /v1/messages``), mounted on the same app."""
