"""Speculative decoding's draft model, run by each worker beside the target.

The draft model (a smaller checkpoint with the target's vocabulary) keeps
its own KV cache in the same blocks as the target: the same block ids,
block tables and slot mappings, tensors of its own (so the KV budget
counts both, ``kv_bytes_per_block``). Two things happen each step:

1. ``follow``: the draft model runs over the step's tokens, on the
   target's own prepared batch, so its KV mirrors the target's for every
   computed position (prompt chunks, prefix-cache hits, drafts the target
   is verifying). A rejected draft's KV is simply written again later, as
   the target's is.
2. ``propose``: for each request that sampled and may speculate, the draft
   model decodes ``num_speculative_tokens`` tokens greedily from the
   request's newest token, one batched step per draft. Those positions lie
   in the KV lookahead the scheduler allocates (``num_lookahead_tokens``);
   a request whose blocks end sooner gets fewer drafts. The guesses go back
   in ``ModelRunnerOutput.draft_token_ids`` for the scheduler to send with
   the request's next step.

Greedy guesses are one-hot draft distributions, so the verification rule of
``spec_verify.py`` (accept ``d`` with probability ``p(d)``) keeps random
requests exact too. Where the platform captures the target's decode steps
as graphs, the draft's one-token steps are captured too (the same graph
runner, ``capture_graphs``): its guesses, and its KV for a decode step the
target replayed, come from replays; other steps run it eagerly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.models.layers.attention import ForwardContext
from octavo.runtime.input_batch import PreparedBatch
from octavo.runtime.model_loading import load_model
from octavo.runtime.startup import timed_phase


class DraftModel:
    def __init__(self, runner) -> None:
        self.runner = runner
        config = runner.config
        self.num_speculative_tokens = config.num_speculative_tokens
        draft_config = dataclasses.replace(
            config, model_path=config.speculative_model, quantization=None, max_loras=0, task="generate", hf_overrides=None,
            load_format="dummy" if config.load_format == "dummy" else "safetensors",
        )
        with timed_phase("load the draft model"):
            self.loaded = load_model(draft_config, runner.platform, runner.device, self.model_class())
        self.kv_caches: list[torch.Tensor] = []
        self.graphs = None  # the draft's one-token steps, captured by batch size (``capture_graphs``)
        self.prefill_graphs = None  # ... and its steps of several tokens, by token bucket

    def model_class(self):
        """The draft's class (None: the one its config.json names)."""
        return None

    # ------------------------------------------------------------ KV cache

    def kv_bytes_per_block(self) -> int:
        total = 0
        for backend in self.loaded.layer_backends:
            element_size = torch.empty((), dtype=backend.spec.kv_cache_dtype).element_size()
            total += int(torch.Size(backend.kv_cache_shape(1)).numel()) * element_size
        return total

    def initialize_kv_cache(self, num_blocks: int) -> None:
        platform, device = self.runner.platform, self.runner.device
        self.kv_caches = [torch.empty(0, device=device)] * self.loaded.arch.num_hidden_layers
        for index, backend in self.loaded.layer_backends_by_index.items():
            self.kv_caches[index] = platform.allocate_kv_cache(
                backend.kv_cache_shape(num_blocks), backend.spec.kv_cache_dtype, device
            )

    def capture_graphs(self, factory, sizes: list[int]) -> None:
        """Capture the draft's one-token steps with the platform's graph runner
        (as the target's decode steps are), when the target's were captured."""
        backends = self.loaded.layer_backends
        if not all(getattr(b, "supports_graph_capture", False) for b in backends) or not getattr(
            self.loaded.model, "supports_graph_capture", True
        ):
            return  # its steps run eagerly
        self.graphs = factory(_DraftCaptureView(self), sizes)
        self.graphs.capture()

    def capture_prefill_graphs(self, buckets: list[int], max_num_reqs: int) -> None:
        """The draft's forward over a step of several tokens a request, by
        token bucket (the graph runner's optional ``prefill_graphs``), for
        the steps the target replays from its own prefill graphs."""
        make = getattr(self.graphs, "prefill_graphs", None)
        if make is not None and buckets:
            self.prefill_graphs = make(buckets, max_num_reqs)
            self.prefill_graphs.capture()

    # ----------------------------------------------------------------- step

    def follow(self, batch: PreparedBatch, scheduler_output, graph_size: int | None, prefill_bucket: int | None) -> None:
        """Write the draft model's KV for the step's tokens (the target's
        batch). A step the target replayed from a graph (a decode graph of
        ``graph_size`` requests, a prefill graph of ``prefill_bucket``
        tokens) replays the draft's graph of the same shape on the same
        persistent inputs."""
        if graph_size is not None and self.graphs is not None and self.graphs.padded_size(graph_size) == graph_size:
            self.graphs.replay(graph_size, graph_size)
        elif prefill_bucket is not None and self.prefill_graphs is not None and prefill_bucket in self.prefill_graphs.buckets:
            self.prefill_graphs.replay(prefill_bucket)
        else:
            self._run(batch)

    def propose(self, output: ModelRunnerOutput) -> None:
        """The draft model's guesses for each sampling request's next step, into ``output``."""
        if self.drafting_paused():
            return
        request_ids, positions, last_tokens, limits = self.drafting_requests(output)
        if not request_ids:
            return
        drafts = self._decode(request_ids, np.asarray(positions, dtype=np.int64), last_tokens, limits)
        for request_id, request_drafts in zip(request_ids, drafts):
            output.draft_token_ids[request_id] = request_drafts

    def drafting_paused(self) -> bool:
        """Whether the scheduler drafts for no one now (``disable_by_batch_size``): no guesses to make."""
        max_batch = self.runner.config.speculative_disable_by_batch_size
        return max_batch is not None and len(self.runner.states) >= max_batch

    def drafting_requests(self, output: ModelRunnerOutput) -> tuple[list[str], list[int], list[int], list[int]]:
        """The requests that sampled and may draft: their ids, their newest
        token's position (not computed yet) and the token, and how many
        drafts each can take (draft ``i``, from 1, is decoded from position
        ``+ i - 1``, which must lie in the request's blocks)."""
        states, block_size = self.runner.states, self.runner.config.block_size
        request_ids, positions, last_tokens, limits = [], [], [], []
        for request_id, kept in output.sampled_token_ids.items():
            state = states.get(request_id)
            if not kept or state is None or not _may_draft(state.sampling_params):
                continue
            position = len(state.token_ids) + len(kept) - 1
            limit = min(self.num_speculative_tokens, state.num_blocks * block_size - position)
            if limit >= 1:
                request_ids.append(request_id)
                positions.append(position)
                last_tokens.append(kept[-1])
                limits.append(limit)
        return request_ids, positions, last_tokens, limits

    def _decode(self, request_ids: list[str], positions: np.ndarray, last_tokens: list[int], limits: list[int]):
        """Greedy drafts, one batched one-token step each; request ``j`` takes ``limits[j]``."""
        inputs, device = self.runner.inputs, self.runner.device
        tokens = torch.tensor(last_tokens, dtype=torch.long).to(device)
        active = np.arange(len(request_ids))
        steps: list[tuple[np.ndarray, torch.Tensor]] = []
        for step in range(max(limits)):
            active = active[np.asarray(limits)[active] > step]
            ids = [request_ids[j] for j in active]
            size = self.graphs.padded_size(len(ids)) if self.graphs is not None else None
            batch = inputs.prepare_decode_from_device(ids, positions[active] + step, tokens, size)
            if size is not None:  # a copy: the graph's output is rewritten by its next replay
                guesses = self.graphs.replay(size, len(ids)).clone()
            else:
                guesses = self.guess(batch.input_ids, batch.positions, batch.attn_batch)[: len(ids)]
            steps.append((active, guesses))
            # The next step's inputs: the guesses of the requests that go on.
            keep = np.flatnonzero(np.asarray(limits)[active] > step + 1)
            tokens = guesses.index_select(0, torch.from_numpy(keep).to(device)) if keep.size else guesses[:0]
        return collect_drafts(steps, len(request_ids))

    def graph_step(self, input_ids, positions, attn_batch, num_reqs: int) -> torch.Tensor:
        """The one-token step a graph captures (``_DraftCaptureView``): the guesses."""
        return self.guess(input_ids, positions, attn_batch)

    def guess(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_batch) -> torch.Tensor:
        """The draft model's greedy next token at every position (metadata
        built inside, so that a captured graph replays it)."""
        metadata = self.loaded.metadata_builder.build_metadata(attn_batch)
        hidden = self.loaded.model(input_ids, positions, ForwardContext(attn_metadata=metadata, kv_caches=self.kv_caches))
        return self.loaded.model.compute_logits(hidden).argmax(dim=-1)

    def _run(self, batch: PreparedBatch) -> torch.Tensor:
        metadata = self.loaded.metadata_builder.build_metadata(batch.attn_batch)
        ctx = ForwardContext(attn_metadata=metadata, kv_caches=self.kv_caches)
        return self.loaded.model(batch.input_ids, batch.positions, ctx)


class _DraftCaptureView:
    """What a platform's graph runner reads of a runner, for the draft model
    (or an EAGLE / MTP head: ``graph_step`` is the proposer's):
    a one-token step of placeholder requests in the runner's persistent
    buffers, as a function a graph captures (its output: the guesses, one
    per request); and for prefill graphs, the runner's input buffers and
    options with the draft's model, metadata builder and KV cache."""

    def __init__(self, draft: DraftModel) -> None:
        self.draft = draft
        runner = draft.runner
        self.inputs, self.config, self.device = runner.inputs, runner.config, runner.device
        self.loaded, self.model = draft.loaded, draft.loaded.model

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        return self.draft.kv_caches

    def decode_step_for_capture(self, num_reqs: int):
        from octavo.runtime.cuda_graphs import placeholder_decode_inputs

        input_ids, positions, attn_batch = placeholder_decode_inputs(self.draft.runner, num_reqs)
        return lambda: self.draft.graph_step(input_ids, positions, attn_batch, num_reqs)


def collect_drafts(steps: list[tuple[np.ndarray, torch.Tensor]], num_requests: int) -> list[list[int]]:
    """Each request's drafts from the batched steps (the requests still drafting, their guesses)."""
    drafts: list[list[int]] = [[] for _ in range(num_requests)]
    for active_ids, guesses in steps:
        for j, token in zip(active_ids.tolist(), guesses.tolist()):
            drafts[j].append(token)
    return drafts


def _may_draft(params) -> bool:
    """The runner's half of ``core.speculative_config.may_speculate`` (the
    scheduler checks the rest and cuts drafts a grammar refuses)."""
    return params.is_greedy or params.seed is None
