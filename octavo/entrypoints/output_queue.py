"""One request's outputs between the engine thread and the event loop, merged
while they wait.

Every output a stream takes costs the event loop a fixed amount of Python
(a task wake-up, an SSE chunk, JSON, the ASGI send chain), whatever it
carries. When the loop falls behind the engine (many streams, short steps),
outputs pile up per stream; merging them into one (the text and tokens of
both) makes the loop's work per step shrink as the load grows, instead of
falling further behind. An idle loop takes each output as it comes, so
light load keeps token-by-token streaming. vLLM's API server does the same.

Merging follows the output kind: delta outputs concatenate (per choice
index; the later output's finish reason, cumulative logprob and metrics
win); cumulative outputs are replaced by the newer one. An exception is
never merged: it is queued after what came before it.
"""

from __future__ import annotations

import asyncio
from collections import deque

from octavo.core.outputs import CompletionOutput, RequestOutput


class OutputQueue:
    """The part of ``asyncio.Queue`` a request stream uses, merging ``RequestOutput``s."""

    def __init__(self, delta: bool = True) -> None:
        self.delta = delta
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item) -> None:
        items = self._items
        if items and type(item) is RequestOutput and type(items[-1]) is RequestOutput:
            items[-1] = merge_outputs(items[-1], item) if self.delta else item
        else:
            items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self):
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def get_nowait(self):
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


def merge_outputs(first: RequestOutput, second: RequestOutput) -> RequestOutput:
    """One delta output carrying ``first`` then ``second`` (same request)."""
    completions: dict[int, CompletionOutput] = {c.index: c for c in first.outputs}
    for completion in second.outputs:
        earlier = completions.get(completion.index)
        completions[completion.index] = completion if earlier is None else _merge_completion(earlier, completion)
    return RequestOutput(
        request_id=second.request_id,
        prompt=second.prompt,
        prompt_token_ids=second.prompt_token_ids,
        outputs=list(completions.values()),
        finished=second.finished,
        prompt_logprobs=second.prompt_logprobs if second.prompt_logprobs is not None else first.prompt_logprobs,
        num_cached_tokens=second.num_cached_tokens,
        metrics=second.metrics if second.metrics is not None else first.metrics,
    )


def _merge_completion(first: CompletionOutput, second: CompletionOutput) -> CompletionOutput:
    logprobs = None
    if first.logprobs is not None or second.logprobs is not None:
        logprobs = [*(first.logprobs or []), *(second.logprobs or [])]
    return CompletionOutput(
        index=second.index,
        text=first.text + second.text,
        token_ids=[*first.token_ids, *second.token_ids],
        cumulative_logprob=second.cumulative_logprob,
        logprobs=logprobs,
        finish_reason=second.finish_reason,
        stop_reason=second.stop_reason,
    )
