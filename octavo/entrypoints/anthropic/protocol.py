"""Request body of the Anthropic Messages API (pydantic; unknown fields allowed, known ones strict)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    max_tokens: int
    messages: list[Message] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = False
    metadata: dict | None = None
