"""One step of a pooling model: whole prompts -> hidden states -> one vector
per request (``ModelRunnerOutput.pooled``).

The scheduler never splits a pooling request's prompt, so in a pooling step
request ``i`` is rows ``cu_seqlens[i]:cu_seqlens[i+1]`` of the hidden
states, in the scheduler's order. Encoder-only models get a flat batch of
their own (positions from 0 within each input, segment ids, the
bidirectional attention's metadata) and no KV cache; decoders run through
the runner's usual path (paged KV cache, prefill graphs), then pool. An
encoder's step replays a CUDA graph of its padded shape where the platform
makes them (``encoder_graphs.py``; ``graphs`` is None otherwise). The
model's ``pool`` gives float32 rows on the device; one copy brings them to
the host, where each request's params finish them (``finish_pooled``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import torch

from octavo.core.scheduler_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from octavo.errors import InvalidArgumentError
from octavo.models.layers.attention import ForwardContext
from octavo.models.layers.encoder_attention import EncoderAttentionMetadata
from octavo.models.pooling import PoolingMetadata, finish_pooled
from octavo.runtime.host_copy import copy_to_host
from octavo.runtime.step_upload import packs_uploads, upload_together

if TYPE_CHECKING:
    from octavo.runtime.model_runner import ModelRunner


POOLING_OVERLAP_ENV = "OCTAVO_POOLING_OVERLAP"


def overlap_setting() -> bool | None:
    """``OCTAVO_POOLING_OVERLAP``: unset (None) overlaps where the platform
    can; 0 never (A/B runs); 1 always (tests: the CPU has no device events,
    so each launch there completes before it returns)."""
    value = os.environ.get(POOLING_OVERLAP_ENV, "")
    if value not in ("", "0", "1"):
        raise InvalidArgumentError(f"{POOLING_OVERLAP_ENV}={value!r}: expected 0 or 1 (unset: where the platform can)")
    return None if value == "" else value == "1"


@dataclass
class LaunchedPooling:
    """A pooling step queued on the device: its requests, in the step's order,
    and the host tensor its rows arrive in once ``done`` (an event; None:
    already there)."""

    request_ids: list[str]
    params: list
    rows: torch.Tensor
    done: object | None


class PendingPooling:
    """What the executor hands the engine for a pooling step launched
    without waiting (``core/executor.py``'s ``PendingOutput``)."""

    def __init__(self, pooling: PoolingRunner, launched: LaunchedPooling | None) -> None:
        self._pooling, self._launched = pooling, launched

    def result(self) -> ModelRunnerOutput:
        return ModelRunnerOutput() if self._launched is None else self._pooling.collect(self._launched)


class PoolingRunner:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.pooler = runner.loaded.pooler
        self.device = runner.device
        self.pack_uploads = packs_uploads(runner.platform)
        self.graphs = None  # EncoderGraphs, set by the runner when its platform captures graphs

    def overlaps_steps(self) -> bool:
        """Whether a step may be launched before the one before is collected
        (the engine then keeps two in flight, ``core/engine.py``): an
        encoder, whose steps share no state, on a platform that records
        events into pinned host memory, unless ``OCTAVO_POOLING_OVERLAP``
        says otherwise."""
        setting = overlap_setting()
        if not self.pooler.is_encoder or setting is False:
            return False
        platform = self.runner.platform
        return bool(setting) or (platform.pins_host_memory and platform.create_event() is not None)

    @property
    def keeps_no_state(self) -> bool:
        """An encoder's step reads whole prompts off the scheduler output's new
        requests, so the runner keeps no state for them (``RequestStates`` is
        skipped: a state per short sentence cost more than building the step)."""
        return self.pooler.is_encoder

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.collect(self.launch(scheduler_output, overlap=False))

    def launch(self, scheduler_output: SchedulerOutput, overlap: bool = True) -> LaunchedPooling:
        """Queue the step's forward and pooling on the device, and the copy of
        its rows to the host; with ``overlap`` (where the platform records
        events into pinned memory) without waiting for any of it."""
        request_ids = list(scheduler_output.num_scheduled_tokens)
        seq_lens = np.fromiter(scheduler_output.num_scheduled_tokens.values(), np.int64, len(request_ids))
        if self.pooler.is_encoder:
            requests = self._whole_new_requests(scheduler_output, request_ids, seq_lens)
            hidden, meta = self._run_encoder(requests, seq_lens)
        else:
            requests = [self.runner.states[r] for r in request_ids]
            for state, num_tokens in zip(requests, seq_lens.tolist()):
                if state.num_computed_tokens != 0 or num_tokens != len(state.token_ids):
                    raise RuntimeError(f"pooling request {state.request_id} was not scheduled whole")
            _, hidden = self.runner.forward_hidden(scheduler_output)
            meta = PoolingMetadata.build(seq_lens, self.device)
        rows = self.runner.model.pool(hidden, meta)
        (host,), done = copy_to_host([rows], self.runner.platform) if overlap else ((rows.cpu(),), None)
        return LaunchedPooling(request_ids, [request.pooling_params for request in requests], host, done)

    def collect(self, launched: LaunchedPooling) -> ModelRunnerOutput:
        """Wait for a launched step's rows and finish each request's vector."""
        rows = launched.rows.numpy()
        if launched.done is not None:
            launched.done.synchronize()
            # Out of the pinned block: the outputs are views of ``rows``, and a
            # block they kept alive could not go back to torch's cache (the
            # next step would pin new memory, a slow call).
            rows = rows.copy()
        pooled = finish_pooled(rows, launched.params, self.pooler)
        return ModelRunnerOutput(pooled=dict(zip(launched.request_ids, pooled)))

    @staticmethod
    def _whole_new_requests(
        scheduler_output: SchedulerOutput, request_ids: list[str], seq_lens: np.ndarray
    ) -> list[NewRequestData]:
        """The step's requests, each new and scheduled whole (checked over the
        batch at once: a pooling request has no output tokens, so a prompt
        scheduled whole is as long as its step)."""
        requests = scheduler_output.new_requests
        whole = [new.request_id for new in requests] == request_ids and np.array_equal(
            np.fromiter(map(len, map(attrgetter("prompt_token_ids"), requests)), np.int64, len(requests)), seq_lens
        )
        if not whole:
            raise RuntimeError(f"a pooling step of {len(request_ids)} requests did not schedule each new and whole")
        return requests

    def encoder_forward(self, input_ids, positions, token_type_ids, fctx: ForwardContext) -> torch.Tensor:
        """The encoder's forward as ``EncoderGraphs`` captures it."""
        return self.runner.model(input_ids, positions, fctx, token_type_ids=token_type_ids)

    def _run_encoder(self, requests: list[NewRequestData], seq_lens: np.ndarray) -> tuple[torch.Tensor, PoolingMetadata]:
        """The encoder's hidden states and the step's pooling metadata, every
        input of the step sent to the device together (``upload_together``)."""
        num_tokens = int(seq_lens.sum())
        starts = np.cumsum(seq_lens) - seq_lens
        host = {
            "input_ids": np.fromiter(chain.from_iterable(r.prompt_token_ids for r in requests), np.int64, num_tokens),
            "positions": np.arange(num_tokens, dtype=np.int64) - np.repeat(starts, seq_lens),
        }
        if any(r.token_type_ids is not None for r in requests):
            types = (r.token_type_ids if r.token_type_ids is not None else [0] * len(r.prompt_token_ids) for r in requests)
            host["token_type_ids"] = np.fromiter(chain.from_iterable(types), np.int64, num_tokens)
        pooling = PoolingMetadata.host_arrays(seq_lens)
        if self.graphs is not None:
            replayed = self.graphs.run(seq_lens, host, pooling)
            if replayed is not None:
                hidden, pooling_sent = replayed
                return hidden, PoolingMetadata.on_device(pooling_sent)
        host.update(EncoderAttentionMetadata.host_arrays(seq_lens))
        host.update(pooling)
        sent = upload_together(host, self.device, self.pack_uploads)
        fctx = ForwardContext(attn_metadata=EncoderAttentionMetadata.on_device(seq_lens, sent), kv_caches=[])
        hidden = self.runner.model(sent["input_ids"], sent["positions"], fctx, token_type_ids=sent.get("token_type_ids"))
        return hidden, PoolingMetadata.on_device(sent)
