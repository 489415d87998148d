"""vLLM's ``use_beam_search`` on the OpenAI routes: the ``n`` best beams of a
beam search (``entrypoints/beam_search.py``; ``n`` is the beam width), ranked
with ``length_penalty``, as ``n`` choices of one answer.

Each search step is a batch of one-token requests to the async engine (their
shared prefixes come from the prefix cache), so the engine's request counters
count steps, not searches. A beam search is not streamed, and fields that
would change a beam's score or tokens (sampling settings, penalties, stop
strings, constraints) cannot be combined with it: each is a 400
naming the field, as is a ``temperature`` other than 0. Logprobs come from
the search's steps: up to ``2 * n`` alternatives a token.
"""

from __future__ import annotations

import asyncio
from typing import Any

from octavo.core.outputs import RequestOutput
from octavo.core.sampling_params import SamplingParams
from octavo.entrypoints.beam_search import BeamSearch, BeamSearchParams, as_request_output
from octavo.entrypoints.engine_commands import RequestOptions
from octavo.entrypoints.openai.prompts import PromptInput
from octavo.entrypoints.openai.serving import ServingContext, admit_all, final_outputs
from octavo.errors import InvalidArgumentError

# Fields a beam search honours (or that change nothing it returns); any other field sent is a 400.
BEAM_FIELDS = frozenset({
    "model", "prompt", "messages", "n", "max_tokens", "max_completion_tokens", "use_beam_search", "length_penalty",
    "ignore_eos", "temperature", "stream", "user", "cache_salt", "priority", "return_token_ids", "echo",
    "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "tools", "tool_choice",
    "skip_special_tokens", "logprobs", "top_logprobs", "documents", "add_special_tokens", "include_reasoning", "reasoning_effort",
})


def beam_search_params(body: Any, max_tokens: int | None, max_logprobs: int) -> BeamSearchParams:
    """The request's search, or a 400 for what cannot be combined with it."""
    for name in sorted(body.model_fields_set - BEAM_FIELDS):
        if getattr(body, name) is not None:
            raise InvalidArgumentError(f"{name} cannot be combined with use_beam_search", param=name)
    for name in ("stream", "echo"):  # false / None only
        if getattr(body, name, None) not in (None, False):
            raise InvalidArgumentError(f"{name} cannot be combined with use_beam_search", param=name)
    _check_beam_logprobs(body)
    if max_tokens is None:
        raise InvalidArgumentError("use_beam_search needs max_tokens (the number of search steps)", param="max_tokens")
    params = BeamSearchParams(
        beam_width=body.n or 1, max_tokens=max_tokens, ignore_eos=bool(body.ignore_eos),
        temperature=body.temperature or 0.0,
        length_penalty=body.length_penalty if body.length_penalty is not None else 1.0,
    )
    try:
        params.check_limits(max_logprobs)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(exc.message.replace("beam_width", "n (the beam width)"), param="n") from None
    return params


def _check_beam_logprobs(body: Any) -> None:
    """Logprobs come from the search's own steps, which rank 2 * n alternatives a token."""
    width = body.n or 1
    asked = body.top_logprobs if hasattr(body, "top_logprobs") and body.logprobs else body.logprobs
    if isinstance(asked, bool) or asked is None:
        return
    param = "top_logprobs" if hasattr(body, "top_logprobs") else "logprobs"
    if not 0 <= asked <= 2 * width:
        raise InvalidArgumentError(
            f"with use_beam_search, {param} is at most 2 * n ({2 * width}): a step ranks that many, got {asked}",
            param=param,
        )


def length_check_params(params: BeamSearchParams) -> SamplingParams:
    """What ``check_prompt`` checks a beam search's prompt with: it must leave room for ``max_tokens``."""
    return SamplingParams(max_tokens=params.max_tokens)


async def beam_search_all(
    ctx: ServingContext, request_id: str, prompts: list[PromptInput], params: BeamSearchParams, options: RequestOptions,
) -> list[RequestOutput]:
    """Each prompt's search, concurrently; when one fails the others are cancelled (their requests aborted)."""
    tasks = [asyncio.ensure_future(beam_search(ctx, f"{request_id}-{i}", prompt, params, options))
             for i, prompt in enumerate(prompts)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def beam_search(
    ctx: ServingContext, request_id: str, prompt: PromptInput, params: BeamSearchParams, options: RequestOptions,
) -> RequestOutput:
    """Run one prompt's search on the async engine; its best beams as one output of n completions."""
    search = BeamSearch(prompt.token_ids, params, ctx.limits.eos_token_ids)
    step_params = search.step_params()
    while not search.done:
        # Each beam extends the prompt, so the prompt's images keep their spans in every beam.
        beams = [PromptInput(None, tokens, prompt.image_features) for tokens in search.prompts()]
        streams = await admit_all(ctx, f"{request_id}-step{search.num_steps}", beams, step_params, options)
        finals = await final_outputs(ctx, streams)
        search.advance([final.outputs[0] for final in finals])
    tokenizer = ctx.tokenizer
    decode = None if tokenizer is None else (lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    return as_request_output(request_id, prompt.token_ids, search.result(decode))
