"""Steps padded to static shapes, for platforms that compile them (plugin API 1.1).

A platform whose ``step_buckets(config)`` returns ``StepBuckets`` gets every
step those buckets cover padded to its bucket's ``StepShape``
(``InputPreparer.prepare_static``: padding tokens belong to no request, slot
-1; padding requests have no tokens and no context; the sampled rows are
padded to the shape's requests and the padding rows are never sampled). The
padded step (the model from the attention metadata on, then the logits of
the sampled rows) runs through the function the platform's ``compile_step``
returned, so a compiler (XLA's tracer, ``torch.compile``, a vendor's graph
mode) sees one shape per bucket.

``warm_up`` runs every shape once when the KV cache exists, with a progress
bar: placeholder requests whose KV goes nowhere (slot -1), then a greedy
sample, as a real step would. Steps asking for prompt logprobs, and steps no
bucket fits, run unpadded (the runner's ordinary path).

``CompilationTracker`` reads the platform's compilation counter around each
step; a step that compiles after warm-up is logged as a warning. The counts
go back to the engine with each step's output (``/metrics``).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from octavo.core.scheduler_output import CompilationCounts, SchedulerOutput
from octavo.models.layers.attention import ForwardContext
from octavo.platforms.interface import Platform
from octavo.platforms.step_shapes import StepBuckets, StepShape

logger = logging.getLogger(__name__)


class CompilationTracker:
    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.counts: CompilationCounts | None = None if platform.compilations() is None else CompilationCounts()
        self.warmed_up = False

    def read(self) -> int | None:
        return self.platform.compilations()

    def update(self, before: int | None, what: str) -> CompilationCounts | None:
        """Account for the compilations since ``before`` (a ``read()``) in step ``what``."""
        after = self.read()
        if after is None or before is None or self.counts is None:
            return self.counts
        new = after - before
        if new <= 0:
            return self.counts
        self.counts = CompilationCounts(self.counts.total + new, self.counts.after_warmup)
        if self.warmed_up:
            self.counts.after_warmup += new
            logger.warning(
                "%d program(s) compiled after warm-up, in %s (%d so far): a step no bucket covers (or one asking for "
                "prompt logprobs), or sampling that warm-up does not run (logprobs, penalties, random draws)",
                new, what, self.counts.after_warmup,
            )
        return self.counts


class StaticSteps:
    def __init__(self, runner, buckets: StepBuckets) -> None:
        self.runner = runner
        self.buckets = buckets
        self.forward = runner.platform.compile_step(self.step)
        self.num_steps = 0

    def step(self, input_ids, positions, attn_metadata, logits_indices) -> torch.Tensor:
        """What the platform compiles: the model and the sampled rows' logits."""
        runner = self.runner
        hidden = runner.model(input_ids, positions, ForwardContext(attn_metadata, runner.kv_caches))
        return runner.model.compute_logits(hidden[logits_indices])

    def shape_for(self, scheduler_output: SchedulerOutput, intermediate) -> StepShape | None:
        runner = self.runner
        if intermediate is not None or runner.config.pipeline_parallel_size > 1:
            return None
        states = [runner.states[r] for r in scheduler_output.num_scheduled_tokens]
        if any(s.sampling_params.prompt_logprobs is not None for s in states):
            return None
        longest = max(s.num_computed_tokens + n for s, n in zip(states, scheduler_output.num_scheduled_tokens.values()))
        num_blocks = -(-longest // runner.config.block_size)
        return self.buckets.shape_for(scheduler_output.total_num_scheduled_tokens, len(states), num_blocks)

    def run(self, batch) -> torch.Tensor:
        """The padded batch's logits (one row per request of the shape)."""
        metadata = self.runner.loaded.metadata_builder.build_metadata(batch.attn_batch)
        self.num_steps += 1
        return self.forward(batch.input_ids, batch.positions, metadata, batch.logits_indices)

    # --------------------------------------------------------------- warm-up

    def warm_up(self, tracker: CompilationTracker) -> None:
        from tqdm import tqdm

        platform = self.runner.platform
        shapes = self.buckets.shapes()
        # Whatever loading and allocation left queued (a lazy device's pending
        # weights and caches) runs now, outside the programs counted below.
        platform.end_step()
        platform.synchronize()
        started = time.perf_counter()
        first = tracker.read()
        with platform.grad_mode():
            for shape in tqdm(shapes, desc="warming up step shapes", unit="shape", disable=None):
                before = tracker.read()
                platform.begin_step()
                # What a real step holds when it ends (a lazy device's graph
                # outputs are the live tensors): the batch, logits, tokens.
                batch = self._placeholder_batch(shape)
                logits = self.run(batch)
                tokens = logits.argmax(dim=-1)
                platform.end_step()
                tokens.tolist()
                del batch, logits, tokens
                tracker.update(before, f"warm-up of {shape.describe()}")
        tracker.warmed_up = True
        compiled = "" if first is None else f", {tracker.read() - first} programs compiled"
        logger.info(
            "warmed up %s in %.1fs%s", self.buckets.describe(), time.perf_counter() - started, compiled
        )

    def _placeholder_batch(self, shape: StepShape):
        """A step of ``shape`` in the runner's buffers: for a decode shape one
        token per request, else every token in the first request; no KV written."""
        runner = self.runner
        buffers, block_size = runner.inputs.buffers, runner.config.block_size
        num_reqs = shape.num_reqs if shape.is_decode else 1
        lengths = np.ones(num_reqs, dtype=np.int64) if shape.is_decode else np.array([shape.num_tokens])
        query_start = np.concatenate([[0], np.cumsum(lengths)])
        width = shape.block_table_width or 1
        total_reqs = shape.num_reqs if shape.block_table_width else num_reqs
        buffers.input_ids.np[: shape.num_tokens] = 0
        buffers.positions.np[: shape.num_tokens] = 0
        buffers.slot_mapping.np[: shape.num_tokens] = -1
        buffers.query_start_loc.np[: total_reqs + 1] = query_start[-1]
        buffers.query_start_loc.np[: num_reqs + 1] = query_start
        buffers.seq_lens.np[:total_reqs] = 0
        buffers.seq_lens.np[:num_reqs] = lengths
        buffers.block_table.np[: total_reqs * width] = 0
        from octavo.runtime.input_batch import PreparedBatch, staged_attention_batch

        attn_batch = staged_attention_batch(
            buffers, total_reqs, width, shape.num_tokens, num_reqs, int(query_start[-1]),
            max_query_len=shape.max_query_len if shape.block_table_width else int(lengths.max()),
            max_seq_len=width * block_size if shape.block_table_width else int(lengths.max()),
        )
        return PreparedBatch(
            input_ids=buffers.input_ids.upload(shape.num_tokens),
            positions=buffers.positions.upload(shape.num_tokens),
            attn_batch=attn_batch,
            num_tokens=int(query_start[-1]),
            logits_indices=buffers.to_device(np.zeros(shape.num_reqs, dtype=np.int64)),
            sample_request_ids=[],
            is_uniform_decode=shape.is_decode,
        )
