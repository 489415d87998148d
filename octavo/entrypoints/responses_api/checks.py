"""What a Responses request may not ask of this server, refused (400) before
anything runs: each with the field it came from and why.

Nothing that would change the answer is ignored: automatic truncation,
verbosity, ``include`` values other than the two it honours, unknown summary
modes, stored prompts and the Conversations API's ``conversation`` are
refused (``reasoning.effort`` is checked against the chat template by the
route); fields that change nothing generated (routing hints, cache keys)
pass (``field_policy``).
"""

from __future__ import annotations

from octavo.entrypoints.openai.field_policy import check_undeclared_fields
from octavo.entrypoints.responses_api.protocol import ResponsesRequest
from octavo.entrypoints.responses_api.store import ResponseStore
from octavo.errors import InvalidArgumentError

# reasoning.encrypted_content: reasoning items carry their text in content (no encrypted copy), which is
# what a stateless client sends back; nothing generated depends on it.
INCLUDABLE = frozenset({"message.output_text.logprobs", "reasoning.encrypted_content"})
SUMMARIES = frozenset({"auto", "concise", "detailed"})
UNDECLARED_REASONS = {
    "conversation": "the Conversations API is not supported: send previous_response_id, or the whole input",
    "prompt": "stored prompt templates are not supported: send instructions and input",
    "response_format": "the Responses API takes the output format as text.format",
    "messages": "the Responses API takes the conversation as input (items)",
}


def reject_unsupported(body: ResponsesRequest, max_logprobs: int) -> None:
    for name, reason in UNDECLARED_REASONS.items():
        if name in (body.model_extra or {}):
            raise InvalidArgumentError(f"{name} is not supported: {reason}", param=name)
    check_undeclared_fields(body, "responses")
    if isinstance(body.input, list) and not body.input:
        raise InvalidArgumentError("input is empty", param="input")
    if body.truncation not in (None, "disabled"):
        raise InvalidArgumentError(
            f"truncation {body.truncation!r} is not supported: the conversation must fit the context",
            param="truncation",
        )
    _reject_reasoning_options(body)
    for index, value in enumerate(body.include or []):
        if value not in INCLUDABLE:
            raise InvalidArgumentError(
                f"include {value!r} is not supported (only {', '.join(sorted(INCLUDABLE))})", param=f"include.{index}"
            )
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= max_logprobs:
        raise InvalidArgumentError(
            f"top_logprobs must be in [0, {max_logprobs}], got {body.top_logprobs}", param="top_logprobs"
        )
    if body.max_tool_calls is not None and body.max_tool_calls < 1:
        raise InvalidArgumentError(
            f"max_tool_calls must be at least 1, got {body.max_tool_calls}", param="max_tool_calls"
        )


def _reject_reasoning_options(body: ResponsesRequest) -> None:
    """``reasoning.effort`` is checked against the chat template by the route; a summary is
    accepted (no summarizer: reasoning items carry the whole reasoning as content, and
    an empty summary, as OpenAI's models without one answer)."""
    reasoning = body.reasoning
    for name in ("summary", "generate_summary"):
        value = getattr(reasoning, name, None) if reasoning is not None else None
        if value is not None and value not in SUMMARIES:
            raise InvalidArgumentError(
                f"reasoning.{name} must be one of {', '.join(sorted(SUMMARIES))}, got {value!r}", param=f"reasoning.{name}"
            )
    if body.text is not None and body.text.verbosity is not None:
        raise InvalidArgumentError("text.verbosity is not supported", param="text.verbosity")


def wants_stored(body: ResponsesRequest, store: ResponseStore) -> bool:
    """Whether the response will be stored (``store`` defaults to true where the server stores)."""
    if body.background and (body.store is False or not store.enabled):
        why = "store is false" if store.enabled else f"this server keeps no responses ({store.why_off})"
        raise InvalidArgumentError(f"a background response is kept for polling, but {why}", param="background")
    if store.enabled:
        return body.store is not False
    if body.store or body.previous_response_id is not None:
        param = "store" if body.store else "previous_response_id"
        raise InvalidArgumentError(
            f"{param} needs stored responses, which this server does not keep ({store.why_off})", param=param
        )
    return False
