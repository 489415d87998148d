"""The Anthropic Messages API's request body (pydantic; unknown fields allowed,
known ones strict, numbers representable: ``openai/field_types``) and its
answers (closed models, like ``openai/responses``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from octavo.entrypoints.openai.field_types import FiniteFloat, Int64
from octavo.entrypoints.openai.protocol import ConstraintFields
from octavo.entrypoints.openai.responses import ResponseModel


class AnthropicModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentBlock(AnthropicModel):
    type: str
    text: str | None = None
    # tool_use (assistant)
    id: str | None = None
    name: str | None = None
    input: dict | None = None
    # tool_result (user)
    tool_use_id: str | None = None
    content: str | list[dict] | None = None
    is_error: bool | None = None
    # thinking (assistant)
    thinking: str | None = None
    signature: str | None = None
    # image (user): {"type": "base64", "media_type": "image/png", "data": ...}
    source: dict | None = None


class Message(AnthropicModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class ConversationFields(AnthropicModel):
    """What renders the prompt: shared by messages and count_tokens."""

    model: str
    # A last assistant message is a prefill: the answer continues it.
    messages: list[Message] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[dict] | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None


class MessagesRequest(ConversationFields, ConstraintFields):
    max_tokens: Int64
    stop_sequences: list[str] | None = None
    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    top_k: Int64 | None = None
    stream: bool | None = False
    metadata: dict | None = None
    # The output constraints of the OpenAI routes come as extensions (ConstraintFields).


class CountTokensRequest(ConversationFields):
    pass


# ------------------------------------------------------------ responses


class TextBlock(ResponseModel):
    type: Literal["text"]
    text: str


class ThinkingBlock(ResponseModel):
    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseBlock(ResponseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class MessageUsage(ResponseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None  # prompt tokens read from the prefix cache


class MessageResponse(ResponseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextBlock | ThinkingBlock | ToolUseBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: MessageUsage


class CountTokensResponse(ResponseModel):
    input_tokens: int
