"""The Responses API's request body (pydantic: unknown fields allowed, known
ones strict, numbers representable, as ``openai/protocol``) and its answers
(closed models, the fuzz suite's contract, as ``openai/responses``).

Input items are one loose model (``type`` tells them apart, ``conversation.py``
checks what each kind needs): an easy message (``role`` and ``content``, no
``type``), ``message``, ``function_call``, ``function_call_output`` and
``reasoning``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from octavo.entrypoints.openai.field_types import Int64
from octavo.entrypoints.openai.protocol import ConstraintFields, EngineRequestFields, OpenAIModel, SamplingKnobs
from octavo.entrypoints.openai.responses import ResponseModel, TokenLogprob


class TextFormat(OpenAIModel):
    type: str
    name: str | None = None
    # ``schema`` would shadow pydantic's own attribute.
    json_schema: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextOptions(OpenAIModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningOptions(OpenAIModel):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class InputItem(OpenAIModel):
    type: str | None = None  # None: an easy message
    role: str | None = None
    content: str | list[dict] | None = None
    id: str | None = None
    status: str | None = None
    # function_call / function_call_output
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[dict] | None = None
    # reasoning
    summary: list[dict] | None = None
    encrypted_content: str | None = None


class ResponsesRequest(ConstraintFields, SamplingKnobs, EngineRequestFields):
    """OpenAI's fields, and vLLM's sampling and engine extensions as on the chat route."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    # None: the rest of the context, as on the chat route.
    max_output_tokens: Int64 | None = None
    top_logprobs: Int64 | None = None
    include: list[str] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Int64 | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    stream: bool | None = False
    store: bool | None = None  # None: true (OpenAI's default)
    previous_response_id: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None
    background: bool | None = None


# ------------------------------------------------------------ responses


class OutputText(ResponseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[dict]
    logprobs: list[TokenLogprob] | None = None


class MessageItem(ResponseModel):
    type: Literal["message"]
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCallItem(ResponseModel):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(ResponseModel):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(ResponseModel):
    type: Literal["reasoning"]
    id: str
    summary: list[dict]
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = MessageItem | FunctionCallItem | ReasoningItem


class InputTokensDetails(ResponseModel):
    cached_tokens: int


class OutputTokensDetails(ResponseModel):
    reasoning_tokens: int


class ResponseUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(ResponseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(ResponseModel):
    code: str
    message: str


class ResponseObject(ResponseModel):
    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    background: bool
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict
    store: bool
    temperature: float | None
    text: dict
    tool_choice: str | dict
    tools: list[dict]
    top_logprobs: int | None
    top_p: float | None
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]


class DeletedResponse(ResponseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class InputItemList(ResponseModel):
    object: Literal["list"]
    data: list[dict]
    first_id: str | None
    last_id: str | None
    has_more: bool
