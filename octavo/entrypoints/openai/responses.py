"""What the routes answer, as pydantic models: the response half of the served
OpenAPI document (``openapi.py``).

The routes build their bodies as plain dicts (streams send one per token, and
validating each would cost more than the token); these models are the
contract those dicts are held to: the fuzz suite (schemathesis) checks every
answer it gets against them. Fields are closed (``extra="forbid"``), so an
undocumented field is caught too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

FinishReason = Literal["stop", "length", "tool_calls"]


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------- errors


class OpenAIErrorDetail(ResponseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorResponse(ResponseModel):
    error: OpenAIErrorDetail


class AnthropicErrorDetail(ResponseModel):
    type: str
    message: str


class AnthropicErrorResponse(ResponseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail


# -------------------------------------------------------------- completions


class PromptTokensDetails(ResponseModel):
    cached_tokens: int  # read from the prefix cache


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class LegacyLogprobs(ResponseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(ResponseModel):
    logprob: float
    rank: int | None
    decoded_token: str


# vLLM's prompt_logprobs: per prompt position (None first), token id -> its logprob.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: int | str | None
    # With return_token_ids: the prompt's ids and the choice's (its stop token included).
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None  # with prompt_logprobs


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: None


# --------------------------------------------------------------------- chat


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(ResponseModel):
    content: list[TokenLogprob]


class FunctionCall(ResponseModel):
    name: str
    arguments: str


class ToolCall(ResponseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(ResponseModel):
    role: Literal["assistant"]
    content: str | None
    # With --reasoning-parser: the reasoning, apart from the answer.
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(ResponseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: int | str | None
    token_ids: list[int] | None = None  # with return_token_ids


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: None
    prompt_token_ids: list[int] | None = None  # with return_token_ids
    prompt_logprobs: PromptLogprobs | None = None  # with prompt_logprobs


# -------------------------------------------------------------- small routes


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int


class ModelList(ResponseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None  # with return_token_strs


class DetokenizeResponse(ResponseModel):
    prompt: str


class HealthResponse(ResponseModel):
    status: Literal["ok"]


class ResetResponse(ResponseModel):
    reset: Literal[True]


class VersionResponse(ResponseModel):
    version: str
