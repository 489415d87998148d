"""Small shared types: ids are ``NewType``s so that a block id is never
confused with a token id or a request id."""

from typing import NewType

RequestId = NewType("RequestId", str)
BlockId = NewType("BlockId", int)
BlockHash = NewType("BlockHash", bytes)
