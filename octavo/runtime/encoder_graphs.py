"""Encoder-only pooling steps (BERT, XLM-RoBERTa) captured as CUDA graphs by padded shape.

An embedding model's step is short and wide: all-MiniLM-L6 at 256 short
sentences is ~3,800 tokens through six small layers, about 80 kernels
whose launching takes the host longer (~2 ms on an H100's host) than the
GPU needs to run them. A graph replays them in one launch.

What a step's kernels depend on is its flat token count and the attention
grid (sequences x longest sequence, ``encoder_attention``), so a graph is
kept per ``EncoderShape``: each of the three rounded up to a granule of an
eighth of the power of two below it (at least 8), which pads by at most 1/8 and
makes batches of similar sentences share one graph. A shape is captured
the second time it is seen (a one-off shape runs eagerly and costs no
capture), and at most ``max_graphs`` are kept, the least recently used
dropped first. Padding rows and sequences are laid out by
``EncoderAttentionMetadata.padded_host_arrays`` and never reach a real
token's output. Pooling runs after the replay, eagerly, on the real rows.

The graphs are made by the platform (``StepGraphs.encoder_graphs``, CUDA's
in ``cuda_graphs.py``): this file only decides shapes, buffers and when to
capture, so on the CPU a test hands it a capture function that runs eagerly.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from octavo.models.layers.attention import ForwardContext
from octavo.models.layers.encoder_attention import EncoderAttentionMetadata
from octavo.runtime.step_upload import packed_size, upload_together

logger = logging.getLogger(__name__)

# (run) -> (graph, output): the graph replays ``run``'s kernels into ``output``.
CaptureFn = Callable[[Callable[[], torch.Tensor]], tuple[Any, torch.Tensor]]
# (input_ids, positions, token_type_ids, attention metadata) -> hidden states.
EncoderForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ForwardContext], torch.Tensor]

DEFAULT_MAX_ENCODER_GRAPHS = 16
# Shapes seen but not yet captured are forgotten past this many (a server's inputs vary without end).
MAX_REMEMBERED_SHAPES = 4096
GRAPH_ARRAYS = ("input_ids", "positions", "token_type_ids", "grid_index", "token_cells", "key_bias", "attn_cu_seqlens")


def padded(count: int) -> int:
    """``count`` rounded up to a granule of an eighth of the largest power of
    two not above it, at least 8: at most 1/8 more."""
    granule = max(8, (1 << max(count, 1).bit_length() - 1) // 8)
    return -(-count // granule) * granule


@dataclass(frozen=True)
class EncoderShape:
    """The padded step one graph runs."""

    num_tokens: int
    num_seqs: int
    max_seqlen: int

    @classmethod
    def of(cls, seq_lens: np.ndarray) -> EncoderShape:
        return cls(padded(int(seq_lens.sum())), padded(len(seq_lens)), padded(int(seq_lens.max())))


@dataclass
class EncoderGraph:
    graph: Any
    hidden: torch.Tensor  # [shape.num_tokens, hidden], refilled by each replay
    buffer: torch.Tensor  # uint8 on the device: the graph's inputs, then the step's pooling arrays


class EncoderGraphs:
    def __init__(
        self, forward: EncoderForward, device: torch.device, capture: CaptureFn, max_tokens: int,
        max_graphs: int = DEFAULT_MAX_ENCODER_GRAPHS,
    ) -> None:
        self.forward = forward
        self.device = device
        self.capture_fn = capture
        self.max_tokens = max_tokens
        self.max_graphs = max_graphs
        self.graphs: OrderedDict[EncoderShape, EncoderGraph] = OrderedDict()
        self.seen: set[EncoderShape] = set()
        self.failed: set[EncoderShape] = set()  # shapes whose capture ran out of memory: eager from then on
        self.disabled = False  # a capture failed otherwise: every step eager
        self.num_captures = 0
        self.num_replays = 0

    def run(
        self, seq_lens: np.ndarray, tokens: dict[str, np.ndarray], extra: dict[str, np.ndarray]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """The step's hidden states (its real tokens' rows) and ``extra`` on the
        device, or None: run this step eagerly. ``tokens`` holds the flat
        ``input_ids``, ``positions`` and optionally ``token_type_ids``."""
        shape = EncoderShape.of(seq_lens)
        if self.disabled or shape.num_tokens > self.max_tokens or shape in self.failed:
            return None
        entry = self.graphs.get(shape)
        if entry is None and shape not in self.seen:
            if len(self.seen) >= MAX_REMEMBERED_SHAPES:
                self.seen.clear()
            self.seen.add(shape)
            return None
        arrays = dict(self._graph_arrays(shape, seq_lens, tokens), **extra)
        if entry is None:
            entry = self._capture(shape, arrays)
            if entry is None:
                return None
        else:
            self.graphs.move_to_end(shape)
        sent = upload_together(arrays, self.device, pack=True, into=entry.buffer)
        entry.graph.replay()
        self.num_replays += 1
        num_tokens = int(seq_lens.sum())
        return entry.hidden[:num_tokens], {name: sent[name] for name in extra}

    @staticmethod
    def _graph_arrays(shape: EncoderShape, seq_lens: np.ndarray, tokens: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's inputs at ``shape``, in ``GRAPH_ARRAYS``' order (fixed offsets in the buffer)."""
        num_tokens = int(seq_lens.sum())
        arrays = {}
        for name in GRAPH_ARRAYS[:3]:
            array = np.zeros(shape.num_tokens, dtype=np.int64)
            if name in tokens:  # no segment ids: type 0, as the eager path adds
                array[:num_tokens] = tokens[name]
            arrays[name] = array
        arrays.update(EncoderAttentionMetadata.padded_host_arrays(seq_lens, shape.num_seqs, shape.max_seqlen, shape.num_tokens))
        return arrays

    def _views(self, shape: EncoderShape, sent: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
        """The forward a graph captures, reading the buffer's views. The
        metadata is made anew on each call: it caches the key bias in the
        model's dtype, and a conversion made in a warm-up run would be read,
        never redone, by the graph."""

        def run() -> torch.Tensor:
            metadata = EncoderAttentionMetadata(
                shape.num_seqs, shape.max_seqlen, sent["grid_index"], sent["token_cells"], sent["key_bias"],
                sent["attn_cu_seqlens"],
            )
            context = ForwardContext(attn_metadata=metadata, kv_caches=[])
            return self.forward(sent["input_ids"], sent["positions"], sent["token_type_ids"], context)

        return run

    def _capture(self, shape: EncoderShape, arrays: dict[str, np.ndarray]) -> EncoderGraph | None:
        """The shape's graph, or None (the step runs eagerly): a capture that runs
        out of memory gives up on its shape, any other failure on all graphs;
        either way the engine keeps serving."""
        self.seen.discard(shape)
        try:
            return self._try_capture(shape, arrays)
        except torch.OutOfMemoryError:
            logger.warning("no memory to capture an encoder graph of %s: steps of that shape run eagerly", shape)
            self.failed.add(shape)
        except Exception:
            logger.exception("capturing an encoder graph of %s failed: encoder steps run eagerly from now on", shape)
            self.disabled = True
            self.graphs.clear()
        return None

    def _try_capture(self, shape: EncoderShape, arrays: dict[str, np.ndarray]) -> EncoderGraph:
        # Room for the largest pooling arrays a step of this shape brings
        # (two per sequence and one per token, int64), past the graph's own.
        graph_part = {name: arrays[name] for name in GRAPH_ARRAYS}
        size = packed_size(graph_part) + 8 * (2 * shape.num_seqs + 1 + shape.num_tokens) + 64
        buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        sent = upload_together(graph_part, self.device, pack=True, into=buffer)
        graph, hidden = self.capture_fn(self._views(shape, sent))
        entry = self.graphs[shape] = EncoderGraph(graph, hidden, buffer)
        self.num_captures += 1
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return entry
