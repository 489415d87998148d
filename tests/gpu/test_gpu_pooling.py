"""On a CUDA GPU: pooling models (encoders and decoders) against the CPU
reference path, in float32 (pooled vectors within 1e-3) and bfloat16
(embeddings within cosine 0.999 of the float32 CPU ones). Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import PoolingParams
from tests.models.conftest import pooling_dirs, wordpiece_dir  # noqa: F401
from tests.models.test_pooling_parity import MAX_MODEL_LEN, random_inputs, vocab_size

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
NAMES = ["bert", "xlm_roberta", "qwen3_embed", "bert_cls3", "qwen2_cls3"]


def pooled(llm, prompts, name: str) -> np.ndarray:
    token_prompts = [{"prompt_token_ids": p} for p in prompts]
    if "cls" in name:
        outputs = llm.classify(token_prompts, PoolingParams(task="classify", use_activation=False))
    else:
        outputs = llm.embed(token_prompts)
    return np.array([o.outputs.data for o in outputs], dtype=np.float64)


@pytest.mark.parametrize("name", NAMES)
def test_gpu_pooling_matches_the_cpu_reference(name, pooling_dirs, make_llm):  # noqa: F811
    path = pooling_dirs(name)
    prompts = random_inputs(vocab_size(path))
    max_model_len = MAX_MODEL_LEN.get(name, 256)
    cpu = pooled(make_llm(path, platform="cpu", max_model_len=max_model_len), prompts, name)
    gpu = pooled(make_llm(path, platform="cuda", max_model_len=max_model_len), prompts, name)
    assert np.abs(gpu - cpu).max() < 1e-3
    if "cls" not in name:
        half = pooled(make_llm(path, platform="cuda", dtype="bfloat16", max_model_len=max_model_len), prompts, name)
        cosines = (half * cpu).sum(1) / (np.linalg.norm(half, axis=1) * np.linalg.norm(cpu, axis=1))
        assert cosines.min() > 0.999


@pytest.mark.parametrize("name", ["bert", "xlm_roberta", "bert_cls3"])
def test_encoder_steps_replayed_from_cuda_graphs_match_the_eager_ones(name, pooling_dirs, make_llm):  # noqa: F811
    # bfloat16 (the key bias is converted inside the step). A batch three
    # times: eager (first sight), captured, replayed; the same lengths in
    # another order (same shape, other masks: replayed); a batch of another
    # shape (eager); the first again (replayed).
    path = pooling_dirs(name)
    prompts = random_inputs(vocab_size(path))
    moved = prompts[::-1]
    options = dict(platform="cuda", dtype="bfloat16", max_model_len=MAX_MODEL_LEN.get(name, 256))
    eager_llm = make_llm(path, enforce_eager=True, **options)
    eager = {id(p): pooled(eager_llm, p, name) for p in (prompts, moved)}
    llm = make_llm(path, **options)
    graphs = llm.engine.executor.worker.runner.pooling.graphs
    assert graphs is not None
    runs = [(p, pooled(llm, p, name)) for p in (prompts, prompts, prompts, moved)]
    pooled(llm, prompts[:1], name)
    runs.append((prompts, pooled(llm, prompts, name)))
    assert graphs.num_captures == 1 and graphs.num_replays == 4
    for p, got in runs:
        assert np.abs(got - eager[id(p)]).max() < 2e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_encoder_attention_matches_the_grid_reference(dtype):
    # CUDA's encoder_attention (torch's varlen flash attention) against the grid
    # SDPA reference, on real rows, with a captured step's padding: empty
    # sequences after the real ones and tokens past the last sequence.
    from octavo.kernels.encoder_attention import varlen_encoder_attention
    from octavo.models.layers.encoder_attention import EncoderAttentionMetadata
    from octavo.ops import reference

    gen = torch.Generator().manual_seed(0)
    seq_lens = np.array([1, 7, 22, 16, 3, 9])
    heads, head_size, num_tokens = 12, 32, 64
    arrays = EncoderAttentionMetadata.padded_host_arrays(seq_lens, num_seqs=8, max_seqlen=24, num_tokens=num_tokens)
    on_gpu = {name: torch.from_numpy(a).cuda() for name, a in arrays.items()}
    args = (on_gpu["attn_cu_seqlens"], 24, on_gpu["grid_index"], on_gpu["token_cells"],
            on_gpu["key_bias"].to(dtype), heads, head_size**-0.5)
    qkv = (torch.randn(num_tokens, 3 * heads * head_size, generator=gen)).to("cuda", dtype)
    real = int(seq_lens.sum())
    expected = reference.encoder_attention(qkv, *args)[:real].float()
    got = varlen_encoder_attention(qkv, *args)[:real].float()
    assert (got - expected).abs().max() < 2e-2


def test_cuda_resolves_encoder_attention_to_varlen_in_half_precision(pooling_dirs, make_llm):  # noqa: F811
    path = pooling_dirs("bert")
    ops = make_llm(path, platform="cuda", dtype="bfloat16", max_model_len=64).engine.executor.worker.runner.loaded.ops
    assert ops.choice("encoder_attention").impl == "varlen_flash", ops.choice("encoder_attention").describe()
    ops32 = make_llm(path, platform="cuda", max_model_len=64).engine.executor.worker.runner.loaded.ops
    assert ops32.choice("encoder_attention").impl == "reference"


def test_the_pooling_lane_gives_the_schedulers_steps_and_vectors(pooling_dirs, make_llm, monkeypatch):  # noqa: F811
    """An idle engine's pooling lane (``core/pooling_lane.py``) with two steps in
    flight on the GPU: the scheduler's vectors bit for bit, each shape warmed
    first (a graph is captured at its second sight)."""
    path = pooling_dirs("bert")
    prompts = [{"prompt_token_ids": p} for p in random_inputs(vocab_size(path)) * 3]
    llm = make_llm(path, platform="cuda", dtype="bfloat16", max_num_seqs=4, max_model_len=MAX_MODEL_LEN.get("bert", 256))
    assert llm.engine.max_concurrent_batches == 2  # overlapped steps on CUDA
    vectors = {}
    for lane in ("1", "0", "1", "0"):
        monkeypatch.setenv("OCTAVO_POOLING_LANE", lane)
        vectors[lane] = [o.outputs.raw for o in llm.embed(prompts)]
    assert vectors["1"] == vectors["0"]
    assert not llm.engine.has_unfinished_requests()
