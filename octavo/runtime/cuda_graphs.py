"""Decode steps captured as CUDA (or HIP) graphs, one per batch size.

A decode-only step with ``n`` requests replays the graph of the smallest
captured size ``B >= n``: the step's inputs are written into the runner's
persistent buffers (padding rows get slot -1 and length 0), the graph
replays the attention metadata build, the whole model and the LM head, and
the first ``n`` rows of its logits are sampled. Capturing the metadata
build inside the graph means device-side derived tensors are recomputed on
every replay; host-side choices the backend makes are frozen at capture, so
the capture batch claims the longest context (``max_model_len``).
"""

from __future__ import annotations

import bisect
import logging
import time

import numpy as np
import torch

from octavo.core.attention import AttentionBatch
from octavo.models.layers.attention import ForwardContext

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64, then powers of two and their 1.5x."""
    sizes = {1, 2, 4}
    sizes.update(range(8, 65, 8))
    size = 64
    while size < max_num_seqs:
        sizes.update((size + size // 2, size * 2))
        size *= 2
    return sorted(s for s in sizes if s <= max_num_seqs) or [1]


def graph_inputs(runner, num_reqs: int, num_tokens: int, max_query_len: int):
    """(input_ids, positions, AttentionBatch) a graph reads: views of the
    runner's persistent buffers at the padded shape. The batch claims the
    longest context (``max_model_len``), so that host-side choices frozen at
    capture hold for every replay, and carries no per-request host copies
    (``query_start_loc_cpu``, ``seq_lens_cpu``): the capture's own lengths
    say nothing of the steps that will replay it, so no backend may plan on
    them (a single request holding the whole bucket at capture once made a
    long-prompt path replay over every later step of that size)."""
    buffers = runner.inputs.buffers
    batch = AttentionBatch(
        query_start_loc=buffers.query_start_loc.upload(num_reqs + 1),
        seq_lens=buffers.seq_lens.upload(num_reqs),
        block_table=buffers.graph_block_table[:num_reqs],
        slot_mapping=buffers.slot_mapping.upload(num_tokens),
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=max_query_len,
        max_seq_len=runner.config.max_model_len,
    )
    return buffers.input_ids.upload(num_tokens), buffers.positions.upload(num_tokens), batch


def graph_forward(runner, input_ids, positions, batch: AttentionBatch) -> torch.Tensor:
    """The model's final hidden states for ``batch`` (metadata built inside, so a graph replays it)."""
    metadata = runner.loaded.metadata_builder.build_metadata(batch)
    return runner.model(input_ids, positions, ForwardContext(metadata, runner.kv_caches))


def capture_graph(run, pool, stream: torch.cuda.Stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm ``run`` up on ``stream`` (Triton compilation, cuBLAS handles), then
    capture it into a graph whose memory comes from ``pool``; returns the
    graph and the output tensor its replays refill."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        output = run()
    return graph, output


def placeholder_decode_inputs(runner, size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
    """A decode step of ``size`` placeholder requests written into the runner's
    persistent buffers (nothing is written to the KV cache: slots -1)."""
    buffers = runner.inputs.buffers
    buffers.query_start_loc.np[: size + 1] = np.arange(size + 1)
    buffers.seq_lens.np[:size] = 1
    buffers.input_ids.np[:size] = 0
    buffers.positions.np[:size] = 0
    buffers.slot_mapping.np[:size] = -1
    buffers.graph_block_table.zero_()
    return graph_inputs(runner, size, size, max_query_len=1)


class DecodeGraphs:
    """CUDA's ``StepGraphs`` (``octavo.platforms.contract``), made by ``CudaPlatform.graph_runner``."""

    def __init__(self, runner, sizes: list[int]) -> None:
        self.runner = runner
        self.sizes = sorted(sizes)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def padded_size(self, num_reqs: int) -> int | None:
        index = bisect.bisect_left(self.sizes, num_reqs)
        return self.sizes[index] if index < len(self.sizes) else None

    @torch.inference_mode()
    def capture(self) -> None:
        started = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for size in reversed(self.sizes):  # largest first: later ones reuse its pool
            self.graphs[size] = capture_graph(self.runner.decode_step_for_capture(size), self.pool, stream)
        torch.cuda.synchronize()
        logger.info("captured %d decode graphs (%s) in %.1fs", len(self.sizes), self.sizes, time.perf_counter() - started)

    def replay(self, size: int, num_reqs: int) -> torch.Tensor:
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:num_reqs]

    def prefill_graphs(self, buckets: list[int], max_num_reqs: int):
        """Graphs for steps of up to ``buckets[-1]`` tokens, in the decode graphs'
        memory pool (steps replay one at a time)."""
        from octavo.runtime.prefill_graphs import PrefillGraphs

        return PrefillGraphs(self.runner, buckets, max_num_reqs, pool=self.pool)

    def encoder_graphs(self, forward, max_tokens: int):
        """An encoder's steps captured by padded shape as they come
        (``encoder_graphs.py``), in this object's memory pool."""
        from octavo.runtime.encoder_graphs import EncoderGraphs

        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        pool, stream = self.pool, torch.cuda.Stream()

        def capture(run):
            with torch.inference_mode():
                return capture_graph(run, pool, stream)

        return EncoderGraphs(forward, self.runner.device, capture, max_tokens)
