"""The Anthropic Messages API's request body (pydantic; unknown fields allowed,
known ones strict, numbers representable: ``openai/field_types``) and its
answers (closed models, like ``openai/responses``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from octavo.entrypoints.openai.field_types import FiniteFloat, Int64
from octavo.entrypoints.openai.responses import ResponseModel


class AnthropicModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentBlock(AnthropicModel):
    type: str
    text: str | None = None


class Message(AnthropicModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class MessagesRequest(AnthropicModel):
    model: str
    max_tokens: Int64
    # A last assistant message is a prefill: the answer continues it.
    messages: list[Message] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    top_k: Int64 | None = None
    stream: bool | None = False
    metadata: dict | None = None


# ------------------------------------------------------------ responses


class TextBlock(ResponseModel):
    type: Literal["text"]
    text: str


class MessageUsage(ResponseModel):
    input_tokens: int
    output_tokens: int


class MessageResponse(ResponseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence"] | None
    stop_sequence: str | None
    usage: MessageUsage
