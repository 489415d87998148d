"""The front's side of output processing for engine processes.

Engine processes run an ``EngineCore`` and send token ids
(``core/engine_core.py``); the front turns them into ``RequestOutput``s
with its own ``OutputProcessor`` and tokenizer: detokenizing, stop strings,
logprob tokens, timings. That per-token work then runs in the API process
(in each of them with ``--api-server-count``), not between the engine's
steps.

Invariants: a request has states here from ``add`` until its last output
or ``drop``; progress for a request without states (aborted, or a child
that ran past its stop string) is ignored; a child that hits a stop string
is reported once in ``process``'s second result, for the engine to finish.
"""

from __future__ import annotations

from typing import Any

from octavo.core.engine import child_requests
from octavo.core.output_processor import OutputProcessor, ParentRequest
from octavo.core.pooling_params import PoolingParams
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler_output import EngineCoreOutput
from octavo.distributed.output_codec import unpack_outputs


class FrontOutputs:
    def __init__(self, tokenizer: Any | None) -> None:
        self.processor = OutputProcessor(tokenizer)
        self._children: dict[str, list[str]] = {}

    def add(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams | PoolingParams
    ) -> None:
        if isinstance(params, PoolingParams):  # one output: the pooled vector
            self.processor.add_pooling_request(request_id, prompt, prompt_token_ids)
            self._children[request_id] = [request_id]
            return
        parent = ParentRequest(request_id, prompt, prompt_token_ids, params)
        children = child_requests(request_id, params)
        for index, (child_id, child_params) in enumerate(children):
            self.processor.add_request(child_id, index, parent, child_params)
        self._children[request_id] = [child_id for child_id, _ in children]

    @property
    def live_requests(self) -> dict[str, list[str]]:
        """The requests added and not yet finished or dropped, with their children."""
        return self._children

    def add_pooling_batch(self, request_ids: list[str], prompts: list[str | None], prompt_token_ids: list[list[int]]) -> None:
        """``add`` for many pooling inputs at once (``dp_pooling``)."""
        self.processor.add_pooling_requests(request_ids, prompts, prompt_token_ids)
        self._children.update((request_id, [request_id]) for request_id in request_ids)

    def drop(self, request_id: str) -> None:
        self.processor.abort(self._children.pop(request_id, []))

    def process(self, rows: list) -> tuple[list, list[str]]:
        """The outputs of one engine message, and the children that hit a stop string.

        Outputs that are not per-child progress (a pooling result) pass through."""
        core_outputs, passed = [], []
        for item in unpack_outputs(rows):
            (core_outputs if type(item) is EngineCoreOutput else passed).append(item)
        request_outputs, stopped = self.processor.process(core_outputs)
        for output in request_outputs:
            if output.finished:
                self._children.pop(output.request_id, None)
        return [*request_outputs, *passed], stopped

    def clear(self) -> None:
        self.processor.states.clear()
        self._children.clear()
