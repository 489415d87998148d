"""Encoder steps replayed from graphs of their padded shape (``runtime/encoder_graphs.py``).

On the CPU the "graph" reruns the captured forward on the very buffers a
CUDA graph reads, which checks what the graphs add: the padded grid and
token rows, the buffers' fixed layout refilled step after step, when a
shape is captured and which graphs are kept. The vectors and scores must
be those of the eager step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.models.layers.encoder_attention import EncoderAttentionMetadata
from octavo.runtime.encoder_graphs import EncoderGraphs, EncoderShape, padded


class EagerGraph:
    """Replays by running the captured forward again into the output tensor."""

    def __init__(self, run, output: torch.Tensor) -> None:
        self.run, self.output = run, output

    def replay(self) -> None:
        self.output.copy_(self.run())


def eager_capture(run):
    output = run()
    return EagerGraph(run, output), output


def install(llm, max_graphs: int = 16) -> EncoderGraphs:
    pooling = llm.engine.executor.worker.runner.pooling
    pooling.graphs = EncoderGraphs(pooling.encoder_forward, torch.device("cpu"), eager_capture, 4096, max_graphs)
    return pooling.graphs


def test_padded_sizes():
    assert [padded(n) for n in (1, 8, 9, 22, 100, 256, 257, 3800)] == [8, 8, 16, 24, 104, 256, 288, 3840]
    assert EncoderShape.of(np.array([5, 22, 9])) == EncoderShape(40, 8, 24)


def test_padded_grid_keeps_the_real_cells():
    seq_lens = np.array([3, 1, 4])
    plain = EncoderAttentionMetadata.host_arrays(seq_lens)
    grid = EncoderAttentionMetadata.padded_host_arrays(seq_lens, num_seqs=5, max_seqlen=6, num_tokens=11)
    assert grid["grid_index"].shape == (30,) and grid["token_cells"].shape == (11,) and grid["key_bias"].shape == (5, 1, 1, 6)
    cells = grid["token_cells"][:8]
    # Each real token sits in its own sequence's row, at its position, and reads itself back.
    assert list(cells // 6) == [0, 0, 0, 1, 2, 2, 2, 2] and list(cells % 6) == [0, 1, 2, 0, 0, 1, 2, 3]
    assert list(grid["grid_index"][cells]) == list(range(8))
    assert list(plain["token_cells"] // 4) == list(cells // 6)  # the unpadded grid is 4 wide
    bias = grid["key_bias"][:, 0, 0]
    assert np.array_equal(np.isfinite(bias[:3]), np.arange(6)[None, :] < seq_lens[:, None])
    # Padding sequences see one key (no all -inf row, no NaN); padding tokens read cell 0.
    assert np.array_equal(np.isfinite(bias[3:]), np.eye(1, 6, dtype=bool).repeat(2, axis=0))
    assert list(grid["token_cells"][8:]) == [0, 0, 0]
    with pytest.raises(ValueError, match="do not fit"):
        EncoderAttentionMetadata.padded_host_arrays(seq_lens, num_seqs=3, max_seqlen=3, num_tokens=16)


def vectors(outputs) -> np.ndarray:
    return np.stack([np.asarray(o.outputs.data, dtype=np.float64) for o in outputs])


def test_embeddings_through_graphs_are_the_eager_ones(pooling_dirs, make_llm):
    llm = make_llm(pooling_dirs("bert"), max_model_len=32)
    batch = ["the cat sits on the mat", "a dog", "Hello, World!", "x y z w v u t"]
    # Same padded shape (4 sequences, 9 to 16 long, 25 to 32 tokens), other words and lengths.
    other = ["a b c d e f g h i j", "one two", "the mat is red", "dogs and cats"]
    expected = {tuple(texts): vectors(llm.embed(texts)) for texts in (batch, other)}
    graphs = install(llm)
    for texts in (batch, batch, other, batch, other):
        got = vectors(llm.embed(texts))
        np.testing.assert_allclose(got, expected[tuple(texts)], rtol=0, atol=1e-5)
    # Seen once (eager), captured at the second sight, then replayed for both batches.
    assert graphs.num_captures == 1 and graphs.num_replays == 4


def test_bfloat16_steps_convert_their_own_key_bias(pooling_dirs, make_llm):
    # In bfloat16 the float32 key bias is converted in the step: a conversion
    # kept from the capture would mask the next batch's keys with the first's.
    llm = make_llm(pooling_dirs("bert"), max_model_len=32, dtype="bfloat16")
    batch = ["the cat sits on the mat", "a dog", "Hello, World!", "x y z w v u t"]
    other = ["one two", "a b c d e f g h i j", "dogs and cats", "the mat is red"]  # same shape, lengths moved
    expected = {tuple(texts): vectors(llm.embed(texts)) for texts in (batch, other)}
    graphs = install(llm)
    for texts in (batch, batch, other):
        np.testing.assert_allclose(vectors(llm.embed(texts)), expected[tuple(texts)], rtol=0, atol=2e-2)
    assert graphs.num_replays == 2


def test_scores_with_segment_ids_through_graphs(pooling_dirs, make_llm):
    llm = make_llm(pooling_dirs("bert_cross"), max_model_len=32)
    query, docs = "the cat sits", ["on the mat", "a dog barks loudly", "hello"]
    expected = [o.outputs.score for o in llm.score(query, docs)]
    graphs = install(llm)
    for _ in range(3):
        got = [o.outputs.score for o in llm.score(query, docs)]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert graphs.num_captures == 1 and graphs.num_replays == 2


def test_graphs_past_the_cap_drop_the_least_recent(pooling_dirs, make_llm):
    llm = make_llm(pooling_dirs("bert"), max_model_len=32)
    small, large = ["a dog"], ["the cat sits on the mat"] * 9  # 1 and 16 sequences: two shapes
    expected = {len(texts): vectors(llm.embed(texts)) for texts in (small, large)}
    graphs = install(llm, max_graphs=1)
    for texts in (small, small, large, large, small, small):
        np.testing.assert_allclose(vectors(llm.embed(texts)), expected[len(texts)], rtol=0, atol=1e-5)
    # small captured, large captured (small dropped), small seen again: captured anew.
    assert graphs.num_captures == 3 and list(graphs.graphs) == [EncoderShape.of(np.array([4]))]
    graphs.max_tokens = 8  # steps past the graphs' token limit run eagerly
    np.testing.assert_allclose(vectors(llm.embed(large)), expected[len(large)], rtol=0, atol=1e-5)
    assert graphs.num_replays == 3


def test_a_failed_capture_leaves_the_step_eager(pooling_dirs, make_llm):
    # Out of memory: that shape stays eager, others are still captured; any
    # other failure: every step eager from then on. The engine keeps serving.
    llm = make_llm(pooling_dirs("bert"), max_model_len=32)
    small, large = ["a dog"], ["the cat sits on the mat"] * 9
    expected = {len(texts): vectors(llm.embed(texts)) for texts in (small, large)}
    graphs = install(llm)

    def out_of_memory(run):
        raise torch.OutOfMemoryError("no room for the graph")

    graphs.capture_fn = out_of_memory
    for texts in (small, small, small):
        np.testing.assert_allclose(vectors(llm.embed(texts)), expected[1], rtol=0, atol=1e-5)
    assert graphs.failed == {EncoderShape.of(np.array([4]))} and graphs.num_replays == 0
    graphs.capture_fn = eager_capture
    for texts in (large, large, small):
        np.testing.assert_allclose(vectors(llm.embed(texts)), expected[len(texts)], rtol=0, atol=1e-5)
    assert graphs.num_captures == 1 and graphs.num_replays == 1  # large captured; small stays eager

    def broken(run):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs.capture_fn, graphs.max_tokens = broken, 4096
    other = ["x y"] * 3
    for _ in range(2):
        np.testing.assert_allclose(vectors(llm.embed(other)), vectors(llm.embed(other)), rtol=0, atol=1e-6)
    assert graphs.disabled and not graphs.graphs
    np.testing.assert_allclose(vectors(llm.embed(large)), expected[len(large)], rtol=0, atol=1e-5)
    assert graphs.num_replays == 1
