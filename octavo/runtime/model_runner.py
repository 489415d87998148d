"""Runs one step on the selected platform: inputs -> model -> sampler.

The runner owns the model, the KV cache tensors and the per-request state
(``RequestStates``); it knows nothing about scheduling policy. A pooling
model's steps go to its ``PoolingRunner`` (``runtime/pooling_runner.py``)
and run eagerly; an encoder-only model has no KV cache.

Each step runs under the platform's grad mode, between its ``begin_step``
and ``end_step`` (plugin API 1.1); ``end_step`` comes after the step's device
work is queued (model, logits, sampling) and before anything is read on the
host. A platform with static step shapes gets its steps padded and compiled
through ``runtime/static_steps.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.distributed.parallel_state import get_pp_group
from octavo.models.layers.attention import ForwardContext
from octavo.platforms.interface import Platform
from octavo.runtime.config import WorkerConfig
from octavo.runtime.grammar_mask import GrammarMaskUploader
from octavo.runtime.input_batch import InputPreparer, PreparedBatch
from octavo.runtime.input_buffers import InputBuffers
from octavo.runtime.kv_plan import KVCachePlan, plan_kv_cache
from octavo.runtime.model_loading import LoadedModel, load_model
from octavo.runtime.request_state import RequestStates
from octavo.runtime.sampler import Sampler
from octavo.runtime.startup import timed_phase
from octavo.runtime.step_sampling import StepSampling
from octavo.runtime.static_steps import CompilationTracker, StaticSteps

logger = logging.getLogger(__name__)

# Without a budget from the user, the CPU platform gives the KV cache this much.
DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30


class ModelRunner(StepSampling):
    def __init__(self, config: WorkerConfig, platform: Platform, device: torch.device) -> None:
        self.config = config
        self.platform = platform
        self.device = device
        max_blocks_per_req = -(-config.max_model_len // config.block_size)
        self.states = RequestStates(config.max_num_seqs, max_blocks_per_req)
        buffers = InputBuffers(
            max(config.max_num_batched_tokens, config.max_num_seqs), config.max_num_seqs, max_blocks_per_req, device,
            pin_memory=platform.pins_host_memory, fresh=platform.fresh_step_inputs,
        )
        self.inputs = InputPreparer(self.states, buffers, config.block_size, device, platform.create_event)
        self.sampler = Sampler(seed=config.seed, pin_memory=platform.pins_host_memory, logprobs_mode=config.logprobs_mode)
        self.grammar_masks = GrammarMaskUploader(device, platform.pins_host_memory, platform.create_event)
        self.kv_caches: list[torch.Tensor] = []
        self.kv_plan: KVCachePlan | None = None  # set by determine_num_kv_blocks (not with num_kv_blocks given)
        self.loaded: LoadedModel | None = None
        self.eos_token_ids: frozenset[int] = frozenset()
        self.graphs = None
        self.prefill_graphs = None
        self.pooling = None
        self.overlap = None
        self.static_steps: StaticSteps | None = None
        self.lora = None  # the adapters' slots, with LoRA on (``LoRASlots``)
        self.draft = None  # speculative decoding's draft model (``DraftModel``), if any
        self.images = None  # a model that embeds images: their rows (``ImageEmbeddings``)
        self.image_rows: list = []  # this step's image rows (``ImageRows``); [] in text steps
        self.compilations = CompilationTracker(platform)
        self._step_open = False
        self.async_steps = None
        if config.async_scheduling:
            from octavo.runtime.async_steps import AsyncStepper

            self.async_steps = AsyncStepper(self)
        elif config.overlap_decode and config.pipeline_parallel_size == 1:
            from octavo.runtime.decode_overlap import DecodeOverlap

            self.overlap = DecodeOverlap(self)

    # ------------------------------------------------------------ lifecycle

    def load_model(self) -> None:
        started = time.perf_counter()
        self.loaded = load_model(self.config, self.platform, self.device)
        self.model = self.loaded.model
        if self.loaded.lora_layers is not None:
            from octavo.lora.slots import LoRASlots

            self.lora = self.inputs.lora = LoRASlots(
                self.loaded.lora_layers, self.loaded.lora_inputs, self.config.max_num_seqs, self.config.max_cpu_loras
            )
        self.eos_token_ids = self.loaded.eos_token_ids
        if getattr(self.model, "supports_images", False):
            from octavo.runtime.image_embeddings import ImageEmbeddings

            self.images = ImageEmbeddings(self.model)
        if self.config.speculative_model:
            from octavo.runtime.draft_model import DraftModel
            from octavo.runtime.eagle_proposer import EagleProposer

            heads = ("eagle", "eagle3", "mtp")  # drafts that read the target's hidden states
            self.draft = (EagleProposer if self.config.speculative_method in heads else DraftModel)(self)
        if self.loaded.pooler is not None:
            from octavo.runtime.pooling_runner import PoolingRunner

            self.pooling = PoolingRunner(self)
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
        if self.draft is not None:  # its KV lives in the same blocks
            total += self.draft.kv_bytes_per_block()
        return total

    def profile_run(self) -> None:
        """The largest step, writing no KV (``RunnerView``: for ``kv_cache_budget``)."""
        from octavo.platforms.profiling import profile_run

        profile_run(self)

    def decode_step_for_capture(self, num_reqs: int):
        """``RunnerView``: placeholder decode inputs of ``num_reqs`` requests in
        the persistent buffers, and the step (metadata, model, logits) a graph captures."""
        from octavo.runtime.cuda_graphs import graph_forward, placeholder_decode_inputs

        inputs = placeholder_decode_inputs(self, num_reqs)
        return lambda: self.model.compute_logits(graph_forward(self, *inputs))

    def determine_num_kv_blocks(self) -> int:
        config = self.config
        if not self.loaded.uses_kv_cache:
            return 0
        if config.num_kv_blocks is not None:
            return config.num_kv_blocks
        bytes_per_block = self.kv_bytes_per_block()
        budget = config.kv_cache_memory_bytes
        if budget is None:
            with timed_phase("KV cache budget"):
                budget = self.platform.kv_cache_budget(self, config.gpu_memory_utilization)
        if budget is None:
            budget = DEFAULT_CPU_KV_CACHE_BYTES
        # No point in more blocks than max_num_seqs full-length sequences use
        # (the plan keeps what the budget holds beside what is allocated).
        self.kv_plan = plan_kv_cache(
            budget, bytes_per_block, config.block_size, config.max_num_seqs, config.max_model_len
        )
        self.kv_plan.log(config.max_model_len)
        return self.kv_plan.num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        # Indexed by global layer index; layers held by other pipeline ranks
        # get an empty placeholder.
        self.kv_caches = [torch.empty(0, device=self.device)] * self.loaded.arch.num_hidden_layers
        with timed_phase("allocate KV cache"):
            for index, backend in self.loaded.layer_backends_by_index.items():
                self.kv_caches[index] = self.platform.allocate_kv_cache(
                    backend.kv_cache_shape(num_blocks), backend.spec.kv_cache_dtype, self.device
                )
        if self.draft is not None:
            self.draft.initialize_kv_cache(num_blocks)
        self.num_kv_blocks = num_blocks
        with timed_phase("capture graphs"):
            self._maybe_capture_graphs()
        with timed_phase("warm up step shapes"):
            self._maybe_warm_up_static_steps()

    def _maybe_warm_up_static_steps(self) -> None:
        buckets = None if self.config.enforce_eager else self.platform.step_buckets(self.config)
        if buckets is None or get_pp_group().world_size > 1:
            return
        self.static_steps = StaticSteps(self, buckets)
        self.static_steps.warm_up(self.compilations)

    def _maybe_capture_graphs(self) -> None:
        self.graphs = None
        factory = self.platform.graph_runner()
        if factory is None or self.config.enforce_eager or get_pp_group().world_size > 1:
            return  # pipeline stages exchange activations between steps: eager only
        if self.pooling is not None:
            self._maybe_make_encoder_graphs(factory)
            return  # decoders' pooling steps run eagerly (the captured graphs end in the LM head or paged attention)
        backends = self.loaded.layer_backends
        if not all(getattr(b, "supports_graph_capture", False) for b in backends):
            logger.info("not capturing graphs: attention backend %s cannot be captured", backends[0].name)
            return
        if not getattr(self.model, "supports_graph_capture", True):  # e.g. gpt-oss's experts read counts on the host
            logger.info("not capturing graphs: %s cannot be captured", type(self.model).__name__)
            return
        from octavo.runtime.cuda_graphs import graph_batch_sizes

        self.graphs = factory(self, graph_batch_sizes(self.config.max_num_seqs))
        self.graphs.capture()
        if self.draft is not None:
            self.draft.capture_graphs(factory, graph_batch_sizes(self.config.max_num_seqs))
        self._maybe_capture_prefill_graphs()

    def _maybe_make_encoder_graphs(self, factory) -> None:
        """Encoder-only pooling models capture their steps by shape as they come
        (an optional member of ``StepGraphs``: ``encoder_graphs``)."""
        if not self.pooling.pooler.is_encoder:
            return
        make_encoder_graphs = getattr(factory(self, []), "encoder_graphs", None)
        if make_encoder_graphs is not None:
            self.pooling.graphs = make_encoder_graphs(self.pooling.encoder_forward, self.config.max_num_batched_tokens)

    def _maybe_capture_prefill_graphs(self) -> None:
        from octavo.runtime.prefill_graphs import prefill_graph_buckets

        config = self.config
        # No step holds more tokens than its requests' contexts can.
        max_tokens = min(config.max_prefill_graph_tokens, config.max_num_batched_tokens, config.max_model_len * config.max_num_seqs)
        buckets = prefill_graph_buckets(max_tokens)
        # An optional member of the graph-runner protocol (StepGraphs).
        make_prefill_graphs = getattr(self.graphs, "prefill_graphs", None)
        if not buckets or make_prefill_graphs is None:
            return
        self.prefill_graphs = make_prefill_graphs(buckets, self.config.max_num_seqs)
        self.prefill_graphs.capture()
        if self.draft is not None and self.draft.graphs is not None:
            self.draft.capture_prefill_graphs(buckets, self.config.max_num_seqs)

    # ------------------------------------------------------------------ step

    def execute_model_async(self, scheduler_output: SchedulerOutput):
        """Launch one step and return a ``PendingOutput`` at once (async
        scheduling); the step before is collected on the way."""
        from octavo.runtime.async_steps import PendingStep

        with self.platform.grad_mode():
            return PendingStep(self.async_steps, self.async_steps.execute(scheduler_output))

    def launch_pooling_step(self, scheduler_output: SchedulerOutput):
        """An encoder's pooling step queued without waiting (``PoolingRunner.overlaps_steps``):
        a ``PendingOutput`` whose ``result()`` collects it."""
        from octavo.runtime.pooling_runner import PendingPooling

        if scheduler_output.is_empty:
            return PendingPooling(self.pooling, None)
        with self.platform.grad_mode():
            self._step_open = True
            self.platform.begin_step()
            try:
                launched = self.pooling.launch(scheduler_output)
            finally:
                self.end_step()
        return PendingPooling(self.pooling, launched)

    def execute_model(
        self, scheduler_output: SchedulerOutput, intermediate: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> ModelRunnerOutput | tuple[torch.Tensor, torch.Tensor]:
        """One step. A pipeline stage other than the first continues from
        ``intermediate`` (hidden, residual); one other than the last returns
        its (hidden, residual) for the next stage instead of sampling."""
        if self.pooling is None or not self.pooling.keeps_no_state:
            self.apply_scheduler_output(scheduler_output)
        if scheduler_output.is_empty:
            return ModelRunnerOutput()
        before = self.compilations.read()
        with self.platform.grad_mode():
            self._step_open = True
            self.platform.begin_step()
            try:
                result = self._execute(scheduler_output, intermediate)
            finally:
                self.end_step()
        counts = self.compilations.update(before, f"a step of {scheduler_output.total_num_scheduled_tokens} tokens")
        if isinstance(result, ModelRunnerOutput):
            result.compilations = counts
        return result

    def apply_scheduler_output(self, scheduler_output: SchedulerOutput) -> None:
        """The runner's request states after this step's changes, and the step's adapters in their slots."""
        self.states.apply(scheduler_output)
        if self.images is not None:
            self.images.apply(scheduler_output)
            self.image_rows = self.images.plan(scheduler_output, self.states)
        if self.lora is not None and not scheduler_output.is_empty:
            self.lora.prepare_step(scheduler_output, self.states)

    def lora_targets(self) -> dict[str, tuple[int, int]]:
        """The modules a LoRA adapter may name, with their whole (in, out) sizes; {} with LoRA off."""
        return self.lora.targets() if self.lora is not None else {}

    def end_step(self) -> None:
        """The platform's ``end_step``, once per step, before any host read of results."""
        if self._step_open:
            self._step_open = False
            self.platform.end_step()

    def _execute(self, scheduler_output: SchedulerOutput, intermediate) -> ModelRunnerOutput | tuple:
        if self.pooling is not None:
            return self.pooling.execute(scheduler_output)
        if self.static_steps is not None and not self.image_rows:
            shape = self.static_steps.shape_for(scheduler_output, intermediate)
            if shape is not None:
                output = ModelRunnerOutput()
                batch = self.inputs.prepare_static(scheduler_output, shape)
                logits = self.static_steps.run(batch)
                if batch.sample_request_ids:
                    self._sample(logits, batch, output, scheduler_output)
                return output
        if self.overlap is not None:
            if self.overlap.eligible(scheduler_output) and not self.image_rows:
                return self.overlap.execute(scheduler_output)
            self.overlap.drop()
        output = ModelRunnerOutput()
        batch, logits, hidden = self.forward(scheduler_output, intermediate)
        if not get_pp_group().is_last:
            return hidden
        if self.draft is not None:
            graph_size, bucket = self._graph_size(scheduler_output), self._prefill_bucket(scheduler_output, intermediate)
            self.draft.follow(batch, scheduler_output, graph_size, bucket)
        if logits is not None:
            self._sample(logits, batch, output, scheduler_output)
        if self.draft is not None:
            self.draft.propose(output)  # an EAGLE head follows the step here, once its tokens are known
        if batch.prompt_logprob_spans:
            self.prompt_logprobs(hidden, batch, output)
        return output

    def forward(
        self, scheduler_output: SchedulerOutput, intermediate=None, before_model: Callable[[PreparedBatch], None] | None = None
    ) -> tuple[PreparedBatch, torch.Tensor | None, torch.Tensor | None]:
        """Prepare the step's inputs and run the model: (batch, logits of the
        rows that sample or None, hidden states or None after a decode graph).
        ``before_model`` may still change the batch's device inputs (async
        scheduling writes the tokens sampled by the step before)."""
        graph_size = self._graph_size(scheduler_output)
        if graph_size is not None:
            batch = self.inputs.prepare(scheduler_output, padded_num_reqs=graph_size)
            if before_model is not None:
                before_model(batch)
            return batch, self.graphs.replay(graph_size, batch.attn_batch.num_reqs), None
        batch, hidden = self.forward_hidden(scheduler_output, intermediate, before_model)
        if not get_pp_group().is_last or not batch.sample_request_ids:
            return batch, None, hidden
        return batch, self.model.compute_logits(hidden[batch.logits_indices]), hidden

    def forward_hidden(
        self, scheduler_output: SchedulerOutput, intermediate=None, before_model: Callable[[PreparedBatch], None] | None = None
    ) -> tuple[PreparedBatch, torch.Tensor]:
        """The step's inputs and the model's hidden states, through a prefill
        graph when one fits (pooling models run through here too)."""
        bucket = self._prefill_bucket(scheduler_output, intermediate)
        if bucket is not None:
            max_num_reqs = self.prefill_graphs.max_num_reqs
            batch = self.inputs.prepare(scheduler_output, padded_num_reqs=max_num_reqs, padded_num_tokens=bucket)
        else:
            batch = self.inputs.prepare(scheduler_output)
        if before_model is not None:
            before_model(batch)
        if bucket is not None:
            return batch, self.prefill_graphs.replay(bucket)
        return batch, self.run_model(batch, intermediate)

    def _graph_size(self, scheduler_output: SchedulerOutput) -> int | None:
        """The graph to replay for this step, if it is a plain decode step."""
        if self.graphs is None or self.image_rows:
            return None
        num_reqs = len(scheduler_output.num_scheduled_tokens)
        if scheduler_output.total_num_scheduled_tokens != num_reqs:
            return None  # some request computes more than one token
        if any(self.states[r].sampling_params.prompt_logprobs is not None for r in scheduler_output.num_scheduled_tokens):
            return None
        return self.graphs.padded_size(num_reqs)

    def _prefill_bucket(self, scheduler_output: SchedulerOutput, intermediate) -> int | None:
        """The prefill graph (token bucket) to replay for this step, if any."""
        if self.prefill_graphs is None or intermediate is not None or self.image_rows:
            return None
        num_reqs = len(scheduler_output.num_scheduled_tokens)
        return self.prefill_graphs.bucket_for(scheduler_output.total_num_scheduled_tokens, num_reqs)

    def run_model(self, batch: PreparedBatch, intermediate=None):
        metadata = self.loaded.metadata_builder.build_metadata(batch.attn_batch)
        ctx = ForwardContext(attn_metadata=metadata, kv_caches=self.kv_caches)
        if intermediate is not None:
            return self.model(batch.input_ids, batch.positions, ctx, intermediate)
        if self.image_rows:  # the first pipeline stage embeds the step's images
            embeds = self.images.inputs_embeds(batch.input_ids, self.image_rows)
            return self.model(batch.input_ids, batch.positions, ctx, inputs_embeds=embeds)
        return self.model(batch.input_ids, batch.positions, ctx)
