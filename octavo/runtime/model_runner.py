"""Runs one step on the selected platform: inputs -> model -> sampler.

The runner owns the model, the KV cache tensors and the per-request state
(``RequestStates``); it knows nothing about scheduling policy.
"""

from __future__ import annotations

import logging
import time

import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from octavo.distributed.parallel_state import get_pp_group
from octavo.models.layers.attention import ForwardContext
from octavo.platforms.interface import Platform
from octavo.runtime.config import WorkerConfig
from octavo.runtime.input_batch import PreparedBatch, prepare_batch
from octavo.runtime.model_loading import LoadedModel, load_model
from octavo.runtime.request_state import RequestStates
from octavo.runtime.sampler import Sampler, SamplingRow, gather_logprobs

logger = logging.getLogger(__name__)

# Without a budget from the user, the CPU platform gives the KV cache this much.
DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30


class ModelRunner:
    def __init__(self, config: WorkerConfig, platform: Platform, device: torch.device) -> None:
        self.config = config
        self.platform = platform
        self.device = device
        self.states = RequestStates()
        self.sampler = Sampler(seed=config.seed)
        self.kv_caches: list[torch.Tensor] = []
        self.loaded: LoadedModel | None = None
        self.eos_token_ids: frozenset[int] = frozenset()

    # ------------------------------------------------------------ lifecycle

    def load_model(self) -> None:
        started = time.perf_counter()
        self.loaded = load_model(self.config, self.platform, self.device)
        self.model = self.loaded.model
        self.eos_token_ids = self.loaded.eos_token_ids
        logger.info(
            "loaded %s (%s, %.1f MiB of weights) in %.1fs",
            self.loaded.arch.architecture,
            self.config.dtype,
            self.loaded.weight_bytes / 2**20,
            time.perf_counter() - started,
        )

    def kv_bytes_per_block(self) -> int:
        total = 0
        for layer_backend in self.loaded.layer_backends:
            shape = layer_backend.kv_cache_shape(1)
            element_size = torch.empty((), dtype=layer_backend.spec.kv_cache_dtype).element_size()
            total += int(torch.Size(shape).numel()) * element_size
        return total

    def determine_num_kv_blocks(self) -> int:
        config = self.config
        if config.num_kv_blocks is not None:
            return config.num_kv_blocks
        bytes_per_block = self.kv_bytes_per_block()
        budget = config.kv_cache_memory_bytes
        if budget is None:
            budget = self.platform.kv_cache_budget(self, config.gpu_memory_utilization)
        if budget is None:
            budget = DEFAULT_CPU_KV_CACHE_BYTES
        # No point in more blocks than max_num_seqs full-length sequences use.
        useful = config.max_num_seqs * -(-config.max_model_len // config.block_size)
        num_blocks = min(int(budget // bytes_per_block), useful)
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB)", num_blocks, config.block_size, num_blocks * bytes_per_block / 2**20)
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        # Indexed by global layer index; layers held by other pipeline ranks
        # get an empty placeholder.
        self.kv_caches = [torch.empty(0, device=self.device)] * self.loaded.arch.num_hidden_layers
        for index, backend in self.loaded.layer_backends_by_index.items():
            self.kv_caches[index] = torch.zeros(
                backend.kv_cache_shape(num_blocks), dtype=backend.spec.kv_cache_dtype, device=self.device
            )
        self.num_kv_blocks = num_blocks

    # ------------------------------------------------------------------ step

    @torch.inference_mode()
    def execute_model(
        self, scheduler_output: SchedulerOutput, intermediate: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> ModelRunnerOutput | tuple[torch.Tensor, torch.Tensor]:
        """One step. A pipeline stage other than the first continues from
        ``intermediate`` (hidden, residual); one other than the last returns
        its (hidden, residual) for the next stage instead of sampling."""
        self.states.apply(scheduler_output)
        if scheduler_output.is_empty:
            return ModelRunnerOutput()
        batch = prepare_batch(self.states, scheduler_output, self.config.block_size, self.device)
        hidden = self.run_model(batch, intermediate)
        if not get_pp_group().is_last:
            return hidden
        output = ModelRunnerOutput()
        if batch.sample_request_ids:
            logits = self.model.compute_logits(hidden[batch.logits_indices])
            self._sample(logits, batch, output)
        if batch.prompt_logprob_spans:
            self._prompt_logprobs(hidden, batch, output)
        return output

    def run_model(self, batch: PreparedBatch, intermediate=None):
        metadata = self.loaded.metadata_builder.build_metadata(batch.attn_batch)
        ctx = ForwardContext(attn_metadata=metadata, kv_caches=self.kv_caches)
        if intermediate is None:
            return self.model(batch.input_ids, batch.positions, ctx)
        return self.model(batch.input_ids, batch.positions, ctx, intermediate)

    def _sample(self, logits: torch.Tensor, batch: PreparedBatch, output: ModelRunnerOutput) -> None:
        rows = []
        for request_id in batch.sample_request_ids:
            state = self.states[request_id]
            rows.append(SamplingRow(state.sampling_params, state.prompt_token_ids, state.output_token_ids, self.eos_token_ids))
        token_ids, logprobs = self.sampler(logits, rows)
        for request_id, token_id, token_logprobs in zip(batch.sample_request_ids, token_ids, logprobs):
            output.sampled_token_ids[request_id] = [token_id]
            if token_logprobs is not None:
                output.logprobs[request_id] = [token_logprobs]

    def _prompt_logprobs(self, hidden: torch.Tensor, batch: PreparedBatch, output: ModelRunnerOutput) -> None:
        for span in batch.prompt_logprob_spans:
            if not span.target_token_ids:
                continue
            num_top = self.states[span.request_id].sampling_params.prompt_logprobs
            rows = hidden[span.hidden_start : span.hidden_start + len(span.target_token_ids)]
            logprobs = torch.log_softmax(self.model.compute_logits(rows).to(torch.float32), dim=-1)
            entries: list[TokenLogprobs] = [
                gather_logprobs(logprobs[j], token_id, num_top) for j, token_id in enumerate(span.target_token_ids)
            ]
            output.prompt_logprobs[span.request_id] = entries
