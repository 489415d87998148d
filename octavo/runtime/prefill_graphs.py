"""Steps with several tokens per request, captured as CUDA (or HIP) graphs by
token count.

A short prefill (or a mixed step) is bound by the host: an 8B model's
forward launches about 450 kernels, and on a slow host CPU launching them
takes longer than the GPU needs to run them. A step of ``t`` tokens (at
most ``max_tokens``) and at most ``max_num_reqs`` requests instead replays
the graph of the smallest captured bucket ``T >= t``, which ran the model
up to the final hidden states (not the LM head: which rows are sampled
varies, so ``compute_logits`` runs eagerly on the few rows that need it).

Padding (``InputPreparer.prepare(..., padded_num_tokens=T)``): requests
past the real ones have no query tokens and no context; tokens past the
real ones belong to the attention kernels' "virtual" request after the
last, have slot -1 (nothing written), position 0, and come out as zeros
that nobody reads. The attention grid depends only on ``T`` and
``max_num_reqs``, and the backend's host-side choices (prefill tiles) are
the same for every step with a request of more than one token, so one
graph per bucket serves any mix of requests.

Buckets: every 16 tokens to 128, then every 128 to ``max_tokens``: a step
pads by at most 1/8 beyond 128 tokens, where padding starts to cost GPU
time rather than hide under launch overhead.
"""

from __future__ import annotations

import bisect
import logging
import time

import numpy as np
import torch

from octavo.core.attention import AttentionBatch
from octavo.runtime.cuda_graphs import capture_graph, graph_forward, graph_inputs

logger = logging.getLogger(__name__)

# Above this many tokens a step's GPU time dwarfs its launch overhead.
DEFAULT_MAX_PREFILL_GRAPH_TOKENS = 2048


def prefill_graph_buckets(max_tokens: int) -> list[int]:
    """16, 32, ..., 128, then 256, 384, ... up to ``max_tokens`` (included)."""
    sizes = set(range(16, min(128, max_tokens) + 1, 16))
    sizes.update(range(256, max_tokens + 1, 128))
    if max_tokens >= 16:
        sizes.add(max_tokens)
    return sorted(sizes)


def capture_lengths(num_tokens: int, num_reqs: int, max_model_len: int) -> list[int]:
    """Per-request token counts for capturing a ``num_tokens`` bucket: filled
    in order, each at most ``max_model_len`` (the buckets stop at what fits)."""
    if num_tokens > num_reqs * max_model_len:
        raise ValueError(f"{num_tokens} tokens do not fit in {num_reqs} requests of at most {max_model_len}")
    lengths = []
    for _ in range(num_reqs):
        lengths.append(min(max_model_len, num_tokens - sum(lengths)))
    return lengths


class PrefillGraphs:
    def __init__(self, runner, buckets: list[int], max_num_reqs: int, pool=None) -> None:
        self.runner = runner
        self.buckets = sorted(buckets)
        self.max_num_reqs = max_num_reqs
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = pool
        self.num_replays = 0

    def bucket_for(self, num_tokens: int, num_reqs: int) -> int | None:
        """The graph that can run a step of this shape, or None (run eagerly)."""
        if num_reqs > self.max_num_reqs or not self.buckets:
            return None
        index = bisect.bisect_left(self.buckets, num_tokens)
        return self.buckets[index] if index < len(self.buckets) else None

    def _fill_capture_inputs(self, num_tokens: int) -> None:
        """The tokens spread over the requests, none longer than ``max_model_len``
        (no KV written: slots -1). A longer request would make attention read
        past its row of the block table: past the table itself with one request."""
        buffers, num_reqs = self.runner.inputs.buffers, self.max_num_reqs
        lengths = capture_lengths(num_tokens, num_reqs, self.runner.config.max_model_len)
        buffers.query_start_loc.np[0] = 0
        buffers.query_start_loc.np[1 : num_reqs + 1] = np.cumsum(lengths)
        buffers.seq_lens.np[:num_reqs] = lengths
        buffers.input_ids.np[:num_tokens] = 0
        buffers.positions.np[:num_tokens] = np.concatenate([np.arange(n) for n in lengths])
        buffers.slot_mapping.np[:num_tokens] = -1
        buffers.graph_block_table.zero_()

    def graph_inputs(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """What a bucket's graph reads (any ``max_query_len`` > 1 makes the same host-side choices)."""
        return graph_inputs(self.runner, self.max_num_reqs, num_tokens, max_query_len=num_tokens)

    def forward(self, input_ids, positions, batch: AttentionBatch) -> torch.Tensor:
        return graph_forward(self.runner, input_ids, positions, batch)

    @torch.inference_mode()
    def capture(self) -> None:
        started = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for num_tokens in reversed(self.buckets):  # largest first: later ones reuse its memory
            self._fill_capture_inputs(num_tokens)
            inputs = self.graph_inputs(num_tokens)
            self.graphs[num_tokens] = capture_graph(lambda inputs=inputs: self.forward(*inputs), self.pool, stream)
        torch.cuda.synchronize()
        logger.info(
            "captured %d prefill graphs (up to %d tokens, %d requests) in %.1fs",
            len(self.buckets), self.buckets[-1] if self.buckets else 0, self.max_num_reqs, time.perf_counter() - started,
        )

    def replay(self, num_tokens_bucket: int) -> torch.Tensor:
        """The final hidden states of the step whose inputs were just uploaded ([bucket, hidden])."""
        graph, hidden = self.graphs[num_tokens_bucket]
        graph.replay()
        self.num_replays += 1
        return hidden
