"""One response's state: engine outputs in, stream events and the response
object out.

Events carry ``sequence_number`` (0, 1, ...) in the order they are sent. The
response object echoes the request's settings as the engine ran them (the
temperature and top_p after the model's generation defaults), its output
items, its status (``incomplete`` with ``max_output_tokens`` when the token
limit cut it) and usage: ``cached_tokens`` are the prompt tokens read from
the prefix cache, ``reasoning_tokens`` the reasoning text's length in tokens
(re-encoded: the parsers work on text).
"""

from __future__ import annotations

from typing import Any

from octavo.core.outputs import CompletionOutput, RequestOutput
from octavo.core.sampling_params import SamplingParams
from octavo.entrypoints.openai.chat_features import ChatFeatures
from octavo.entrypoints.openai.logprobs import chat_logprobs
from octavo.entrypoints.openai.serving import ServingContext, unix_time
from octavo.entrypoints.responses_api.output import ItemStream
from octavo.entrypoints.responses_api.protocol import ResponsesRequest
from octavo.entrypoints.responses_api.store import ResponseStore


class ResponseBuilder:
    def __init__(
        self, ctx: ServingContext, response_id: str, model: str, body: ResponsesRequest, params: SamplingParams,
        num_prompt_tokens: int, features: ChatFeatures, store: bool,
    ) -> None:
        self.ctx = ctx
        self.response_id = response_id
        self.model = model
        self.body = body
        self.params = params
        self.num_prompt_tokens = num_prompt_tokens
        self.features = features
        self.store = store
        self.shaper = features.shaper()
        self.items = ItemStream(params.logprobs is not None, body.max_tool_calls)
        self.created_at = unix_time()
        self.completed_at: int | None = None
        self.status = "in_progress"  # queued (background), completed, incomplete, failed, cancelled
        self.error: dict | None = None
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.sequence_number = 0

    def numbered(self, event: dict) -> dict:
        event["sequence_number"] = self.sequence_number
        self.sequence_number += 1
        return event

    def opening_events(self) -> list[dict]:
        return [{"type": "response.created", "response": self.response()},
                {"type": "response.in_progress", "response": self.response()}]

    def feed(self, output: RequestOutput) -> list[dict]:
        """The events of one engine output (the whole answer's, when not streaming)."""
        completion = output.outputs[0]
        self.num_output_tokens += len(completion.token_ids)
        self.num_cached_tokens = output.num_cached_tokens
        events = self.items.events(self.shaper.feed(completion.text), self._logprobs(completion))
        if completion.finish_reason is None:
            return events
        events += self.items.events(self.shaper.finish())
        self.status = "incomplete" if completion.finish_reason == "length" else "completed"
        self.completed_at = unix_time()
        events += self.items.close(self.status)
        kind = "response.incomplete" if self.status == "incomplete" else "response.completed"
        return events + [{"type": kind, "response": self.response()}]

    def failed_event(self, code: str, message: str) -> dict:
        self.status = "failed"
        self.error = {"code": code, "message": message}
        return {"type": "response.failed", "response": self.response()}

    def _logprobs(self, completion: CompletionOutput) -> list[dict] | None:
        if self.params.logprobs is None:
            return None
        return chat_logprobs(self.ctx.tokenizer, completion.token_ids, completion.logprobs or [], self.params.logprobs)

    def save(self, store: ResponseStore, input_items: list[dict]) -> dict:
        """Store the finished response where it asked to be; returns it (``store`` false if it did not fit)."""
        response = self.response()
        if self.store and not store.put(response, input_items):
            self.store = response["store"] = False
        return response

    def response(self) -> dict[str, Any]:
        body = self.body
        text_format = None
        if body.text is not None and body.text.format is not None:
            text_format = body.text.format.model_dump(by_alias=True, exclude_none=True)
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "background": bool(body.background),
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": self.model,
            "output": self.items.items if self.completed_at is not None else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": body.reasoning.effort, "summary": body.reasoning.summary} if body.reasoning
            else {"effort": None, "summary": None},
            "store": self.store,
            "temperature": self.params.temperature,
            "text": {"format": text_format or {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else self.features.tool_use.mode,
            "tools": body.tools or [],
            "top_logprobs": body.top_logprobs,
            "top_p": self.params.top_p,
            "truncation": "disabled",
            "usage": self._usage() if self.completed_at is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def _usage(self) -> dict:
        reasoning = "".join(item["content"][0]["text"] for item in self.items.items if item["type"] == "reasoning")
        num_reasoning_tokens = len(self.ctx.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
        return {
            "input_tokens": self.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.num_cached_tokens},
            "output_tokens": self.num_output_tokens,
            "output_tokens_details": {"reasoning_tokens": num_reasoning_tokens},
            "total_tokens": self.num_prompt_tokens + self.num_output_tokens,
        }
