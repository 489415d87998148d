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
requests exact too. The draft model runs eagerly.
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
            config, model_path=config.speculative_model, quantization=None, max_loras=0, task="generate",
            load_format="dummy" if config.load_format == "dummy" else "safetensors",
        )
        with timed_phase("load the draft model"):
            self.loaded = load_model(draft_config, runner.platform, runner.device)
        self.kv_caches: list[torch.Tensor] = []

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

    # ----------------------------------------------------------------- step

    def follow(self, batch: PreparedBatch) -> None:
        """Write the draft model's KV for the step's tokens (the target's batch)."""
        self._run(batch)

    def propose(self, output: ModelRunnerOutput) -> None:
        """The draft model's guesses for each sampling request's next step, into ``output``."""
        states, block_size = self.runner.states, self.runner.config.block_size
        request_ids, positions, last_tokens, limits = [], [], [], []
        for request_id, kept in output.sampled_token_ids.items():
            state = states.get(request_id)
            if not kept or state is None or not _may_draft(state.sampling_params):
                continue
            position = len(state.token_ids) + len(kept) - 1  # the newest token's, not computed yet
            # Draft i (from 1) is decoded from position + i - 1: it must lie in the request's blocks.
            limit = min(self.num_speculative_tokens, state.num_blocks * block_size - position)
            if limit < 1:
                continue
            request_ids.append(request_id)
            positions.append(position)
            last_tokens.append(kept[-1])
            limits.append(limit)
        if not request_ids:
            return
        drafts = self._decode(request_ids, np.asarray(positions, dtype=np.int64), last_tokens, limits)
        for request_id, request_drafts in zip(request_ids, drafts):
            output.draft_token_ids[request_id] = request_drafts

    def _decode(self, request_ids: list[str], positions: np.ndarray, last_tokens: list[int], limits: list[int]):
        """Greedy drafts, one batched one-token step each; request ``j`` takes ``limits[j]``."""
        inputs, device = self.runner.inputs, self.runner.device
        tokens = torch.tensor(last_tokens, dtype=torch.long).to(device)
        active = np.arange(len(request_ids))
        steps: list[tuple[np.ndarray, torch.Tensor]] = []
        for step in range(max(limits)):
            active = active[np.asarray(limits)[active] > step]
            ids = [request_ids[j] for j in active]
            batch = inputs.prepare_decode_from_device(ids, positions[active] + step, tokens, None)
            batch.logits_indices = None
            hidden = self._run(batch)
            guesses = self.loaded.model.compute_logits(hidden[: len(ids)]).argmax(dim=-1)
            steps.append((active, guesses))
            # The next step's inputs: the guesses of the requests that go on.
            keep = np.flatnonzero(np.asarray(limits)[active] > step + 1)
            tokens = guesses.index_select(0, torch.from_numpy(keep).to(device)) if keep.size else guesses[:0]
        drafts: list[list[int]] = [[] for _ in request_ids]
        for active_ids, guesses in steps:
            for j, token in zip(active_ids.tolist(), guesses.tolist()):
                drafts[j].append(token)
        return drafts

    def _run(self, batch: PreparedBatch) -> torch.Tensor:
        metadata = self.loaded.metadata_builder.build_metadata(batch.attn_batch)
        ctx = ForwardContext(attn_metadata=metadata, kv_caches=self.kv_caches)
        return self.loaded.model(batch.input_ids, batch.positions, ctx)


def _may_draft(params) -> bool:
    """The runner's half of ``core.speculative_config.may_speculate`` (the
    scheduler checks the rest: min_tokens, and cuts drafts a grammar refuses)."""
    return not params.edits_logits and (params.is_greedy or params.seed is None)
