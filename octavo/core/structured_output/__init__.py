"""Structured outputs: constraining a request's tokens to a JSON schema, a
regex, a choice or a grammar (xgrammar). ``params`` says what a request asks
for, ``compiler`` compiles it off the engine loop, ``manager`` keeps each
request's matcher and builds each step's token masks; the runner applies
them on the device (``runtime/sampler.py``)."""

from octavo.core.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
