"""``stream_options`` takes only what the server knows: an unknown option is a
validation error (a 400 naming it), never silently ignored (found by the
OpenAPI fuzzer's negative mode)."""

from __future__ import annotations

import pydantic
import pytest

from octavo.entrypoints.openai.protocol import StreamOptions


def test_unknown_stream_options_are_refused():
    assert StreamOptions.model_validate({"include_usage": True}).include_usage is True
    with pytest.raises(pydantic.ValidationError, match="continuous_usage"):
        StreamOptions.model_validate({"include_usage": True, "continuous_usage": True})
