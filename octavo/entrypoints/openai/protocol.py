"""Request bodies of the OpenAI-compatible routes (pydantic).

Unknown fields are accepted, as OpenAI does, but known ones are typed
strictly: ``"temperature": "hot"`` or ``"max_tokens": 1.5`` is a 400, not a
coercion, and so is a number the engine cannot represent (``field_types``).
Ranges are checked by ``SamplingParams`` and the serving layer, which raise
the typed errors with the offending ``param``. These models are also what
the served OpenAPI document says the routes take.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from octavo.entrypoints.engine_commands import RequestOptions
from octavo.entrypoints.openai.field_types import FiniteFloat, Int64, Prompt, TokenId, token_biases
from octavo.errors import InvalidArgumentError

# A salt is a secret per tenant (vLLM suggests 256 random bits, 43 base64
# characters); the cap only bounds what one request can make the server hash.
MAX_CACHE_SALT_CHARS = 1024


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(OpenAIModel):
    # An option this server does not know would change nothing it sends: refused, not ignored.
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = False


class ResponseFormat(OpenAIModel):
    type: str
    json_schema: dict | None = None
    # type "structural_tag": xgrammar's format, or vLLM's older structures and triggers.
    format: dict | None = None
    structures: list | None = None
    triggers: list | None = None


class ConstraintFields(OpenAIModel):
    """vLLM's output-constraint fields (one at most; see structured.py), on every generation route."""

    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class SamplingKnobs(OpenAIModel):
    """The sampling settings every generation route of the OpenAI API takes (vLLM's extras included)."""

    temperature: FiniteFloat | None = None
    top_p: FiniteFloat | None = None
    top_k: Int64 | None = None
    min_p: FiniteFloat | None = None
    presence_penalty: FiniteFloat | None = None
    frequency_penalty: FiniteFloat | None = None
    repetition_penalty: FiniteFloat | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None

    def knob_options(self) -> dict:
        return {name: getattr(self, name) for name in SamplingKnobs.model_fields}


class EngineRequestFields(OpenAIModel):
    """vLLM's request fields for the engine (RequestOptions): the prefix-cache salt and the
    scheduling priority (lower first, needs --scheduling-policy priority)."""

    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    priority: Int64 | None = None

    def request_options(self) -> RequestOptions:
        return RequestOptions(cache_salt=self.cache_salt, priority=self.priority or 0)


class SamplingFields(ConstraintFields, SamplingKnobs, EngineRequestFields):
    """Sampling fields shared by completions and chat (OpenAI's and the usual extras)."""

    model: str | None = None
    n: Int64 | None = 1
    stop_token_ids: list[TokenId] | None = None
    min_tokens: Int64 | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # OpenAI's: token ids (as strings) -> a bias in [-100, 100] added to their logits.
    logit_bias: dict[str, FiniteFloat] | None = None
    # vLLM's: only these token ids may be sampled.
    allowed_token_ids: list[TokenId] | None = None
    # vLLM's: words the output must not contain.
    bad_words: list[str] | None = None
    # vLLM's: keep only the prompt's last k tokens (-1: as many as fit).
    truncate_prompt_tokens: Int64 | None = None
    # vLLM's: the prompt's and each choice's token ids in the answer (RL and agent frameworks
    # train on the exact ids); never part of the sampling options.
    return_token_ids: bool | None = None
    # vLLM's: logprobs' tokens written "token_id:<id>" instead of their text.
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the prompt tokens' logprobs and their top k, in the answer (not streamed).
    prompt_logprobs: Int64 | None = None
    # vLLM's beam search: the n best beams (n is the beam width), ranked with length_penalty.
    use_beam_search: bool | None = None
    length_penalty: FiniteFloat | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None

    def sampling_options(self) -> dict:
        return {
            "n": self.n,
            **self.knob_options(),
            "stop_token_ids": self.stop_token_ids,
            "min_tokens": self.min_tokens,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "logit_bias": token_biases(self.logit_bias),
            "allowed_token_ids": self.allowed_token_ids,
            "bad_words": self.bad_words,
            "truncate_prompt_tokens": self.truncate_prompt_tokens,
        }

    def check_prompt_logprobs(self) -> None:
        """vLLM's rule: prompt logprobs come in a whole answer, never in a stream."""
        if self.prompt_logprobs is not None and self.stream:
            raise InvalidArgumentError("prompt_logprobs is not available with stream=true", param="prompt_logprobs")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: Prompt
    # OpenAI's default; a default the client did not send is capped at the rest of the context.
    max_tokens: Int64 | None = 16
    logprobs: Int64 | None = None
    echo: bool | None = False
    best_of: Int64 | None = None
    suffix: str | None = None


class ContentPart(OpenAIModel):
    type: str
    text: str | None = None
    # type "image_url": {"url": "data:image/png;base64,..."} (OpenAI's shape; a bare string too)
    image_url: dict | str | None = None


class ChatMessage(OpenAIModel):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    # None: the rest of the context (OpenAI's and vLLM's default).
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None
    logprobs: bool | None = False
    top_logprobs: Int64 | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict | None = None
    # vLLM's: documents for RAG chat templates; the tokenizer's special tokens on top of the
    # template's; echo the last message when it is the assistant's (a prefill) before the answer;
    # reasoning_content in the answer (with --reasoning-parser).
    documents: list[dict[str, str]] | None = None
    add_special_tokens: bool | None = False
    echo: bool | None = False
    include_reasoning: bool | None = True
    # OpenAI's; reaches the chat template as reasoning_effort where the template reads it.
    reasoning_effort: str | None = None
    add_generation_prompt: bool | None = True
    # vLLM's: the last (assistant) message is continued, not closed.
    continue_final_message: bool | None = False


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = True
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    # vLLM's: with messages, what else the chat template sees (so that a count matches the chat route's).
    tools: list[dict] | None = None
    chat_template_kwargs: dict | None = None
    documents: list[dict[str, str]] | None = None
    # vLLM's: each token's string too.
    return_token_strs: bool | None = False


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[TokenId]
