"""The triton_paged backend end to end: against the torch reference backend
on the same batches, its plan, its registration, and a whole model through
``LLM`` with greedy tokens identical to the torch backend's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.core.attention import AttentionSpec  # noqa: E402
from octavo.errors import InvalidArgumentError  # noqa: E402
from octavo.kernels.paged_attention import PREFILL_TILES  # noqa: E402
from octavo.runtime.attention.torch_paged import TorchPagedAttention  # noqa: E402
from octavo.runtime.attention.triton_paged import TritonPagedAttention  # noqa: E402
from octavo.runtime.attention.triton_plan import SplitKvPolicy  # noqa: E402
from tests.kernels.batches import BatchSpec, decode_requests, make_batch, mixed_requests  # noqa: E402
from tests.plugins.fake_plugins import sandbox  # noqa: E402, F401


def attention_spec(batch_spec: BatchSpec, sliding_window=None) -> AttentionSpec:
    return AttentionSpec(
        num_heads=batch_spec.num_heads,
        num_kv_heads=batch_spec.num_kv_heads,
        head_size=batch_spec.head_size,
        scale=batch_spec.head_size**-0.5,
        dtype=batch_spec.dtype,
        kv_cache_dtype=batch_spec.dtype,
        block_size=batch_spec.block_size,
        sliding_window=sliding_window,
    )


def compare_backends(batch_spec: BatchSpec, device, sliding_window=None, split_policy=None):
    """Run both backends' build_metadata + forward; return the triton metadata."""
    batch = make_batch(batch_spec, device)
    spec = attention_spec(batch_spec, sliding_window)
    torch_backend, triton_backend = TorchPagedAttention(spec), TritonPagedAttention(spec, split_policy)
    torch_cache, triton_cache = batch.kv_cache.clone(), batch.kv_cache.clone()
    torch_meta = torch_backend.build_metadata(batch.attn_batch)
    triton_meta = triton_backend.build_metadata(batch.attn_batch)
    expected = torch_backend.forward(batch.query, batch.key, batch.value, torch_cache, torch_meta)
    out = triton_backend.forward(batch.query, batch.key, batch.value, triton_cache, triton_meta)
    num_actual = batch.num_actual_tokens
    torch.testing.assert_close(out[:num_actual], expected[:num_actual], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()
    assert torch.equal(triton_cache, torch_cache)
    return triton_meta


@pytest.mark.parametrize("sliding_window", [None, 12], ids=["full", "window12"])
def test_mixed_batch_matches_torch_backend(sliding_window, device):
    meta = compare_backends(BatchSpec(mixed_requests(), num_padding_tokens=3), device, sliding_window)
    assert meta.num_splits == 1 and meta.tiles == PREFILL_TILES


def test_decode_batch_takes_split_path(device):
    policy = SplitKvPolicy(min_seq_len=64)
    meta = compare_backends(BatchSpec(decode_requests([130, 64, 9]), num_padding_tokens=1), device, split_policy=policy)
    # 3 requests x 2 KV heads = 6 programs, fewer than 2 per SM (8 pretend
    # SMs on the CPU); 130 tokens allow two splits of at least 64.
    assert meta.num_splits == 2


def test_short_decode_batch_takes_direct_decode_path(device):
    from octavo.kernels.split_kv_decode import DIRECT_DECODE_TILES

    meta = compare_backends(BatchSpec(decode_requests([30, 3])), device)
    assert meta.num_splits == 1 and meta.tiles == DIRECT_DECODE_TILES


def test_tile_override_from_environment(monkeypatch):
    from octavo.kernels.paged_attention import TileConfig
    from octavo.runtime.attention import triton_plan

    triton_plan._tiles_from_env.cache_clear()
    monkeypatch.setenv("OCTAVO_TILES_DECODE", "16,128,8,4")
    try:
        assert triton_plan.tiles_for_step(1, 1, 128) == TileConfig(16, 128, 8, 4)
        assert triton_plan.tiles_for_step(5, 1, 128) == PREFILL_TILES  # prefill untouched
        # An fp8 cache's decode tiles are its own, overridden by *_FP8 only.
        from octavo.kernels.split_kv_decode import FP8_DIRECT_DECODE_TILES, FP8_SPLIT_TILES

        assert triton_plan.tiles_for_step(1, 1, 128, fp8_cache=True) == FP8_DIRECT_DECODE_TILES
        monkeypatch.setenv("OCTAVO_TILES_SPLIT_FP8", "16,256,8,3")
        assert triton_plan.tiles_for_step(1, 4, 128, fp8_cache=True) == TileConfig(16, 256, 8, 3)
        assert triton_plan.tiles_for_step(1, 4, 128) != FP8_SPLIT_TILES
        monkeypatch.setenv("OCTAVO_TILES_PREFILL_FP8", "128,64,8,2")
        assert triton_plan.tiles_for_step(5, 1, 128, fp8_cache=True) == TileConfig(128, 64, 8, 2)
        assert triton_plan.tiles_for_step(5, 1, 128) == PREFILL_TILES
        monkeypatch.setenv("OCTAVO_TILES_PREFILL", "64,x")
        triton_plan._tiles_from_env.cache_clear()  # read once per process
        with pytest.raises(ValueError, match="OCTAVO_TILES_PREFILL"):
            triton_plan.tiles_for_step(5, 1, 128)
    finally:
        triton_plan._tiles_from_env.cache_clear()


def test_split_policy():
    policy = SplitKvPolicy(min_seq_len=1024, max_splits=32, programs_per_sm=2)
    # Llama-3.1-8B (8 KV heads) on 132 SMs.
    assert policy.num_splits(1, 8, 1, 8192, 132) == 32
    assert policy.num_splits(8, 8, 1, 8192, 132) == 4
    assert policy.num_splits(64, 8, 1, 8192, 132) == 1
    assert policy.num_splits(1, 8, 1, 512, 132) == 1  # short contexts
    default = SplitKvPolicy()
    assert default.num_splits(1, 8, 1, 512, 132) == 8  # at least 64 tokens a split
    assert default.num_splits(1, 8, 1, 200, 132) == 1
    assert policy.num_splits(1, 8, 7, 8192, 132) == 1  # not a decode batch


def test_supports_reasons():
    spec = attention_spec(BatchSpec([]))
    assert TritonPagedAttention.supports(spec) is None
    bad_group = AttentionSpec(6, 4, 32, 0.1, torch.float32, torch.float32, 16)
    assert "multiple" in TritonPagedAttention.supports(bad_group)
    fp8 = AttentionSpec(8, 2, 32, 0.1, torch.bfloat16, torch.float8_e4m3fn, 16)
    assert TritonPagedAttention.supports(fp8) is None  # fp8 caches: tests/kernels/test_fp8_kv_kernels.py
    int8 = AttentionSpec(8, 2, 32, 0.1, torch.bfloat16, torch.int8, 16)
    assert TritonPagedAttention.supports(int8) == (
        "kv_cache_dtype torch.int8 is not supported (float16, bfloat16, float32, fp8 are)"
    )
    assert TritonPagedAttention(spec).kv_cache_shape(10) == (2, 10, 16, 2, 32)


def test_registered_by_the_builtin_plugin():
    from octavo.plugins.builtin import octavo_attention_backends

    assert octavo_attention_backends()["triton_paged"] is TritonPagedAttention


@pytest.mark.parametrize("min_split_seq_len", [1024, 1], ids=["one-launch", "split-decode"])
def test_llm_greedy_tokens_match_torch_backend(min_split_seq_len, llama_dir, make_llm, monkeypatch, sandbox):
    from octavo import SamplingParams
    from octavo.platforms.cpu import CpuPlatform
    from octavo.plugins.manager import reset_plugin_manager
    from tests.kernels.triton_on_cpu import add_triton_on_cpu

    prompts = [{"prompt_token_ids": [5, 9, 23, 7, 41, 3]}, {"prompt_token_ids": [12, 8, 30]}]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in make_llm(llama_dir).generate(prompts, params)]

    # The triton path on the CPU platform: swap its backend, and register
    # Octavo's kernels for it as a vendor would (the GEMV up to the two
    # decode rows of both requests).
    policy = SplitKvPolicy(min_seq_len=min_split_seq_len, min_tokens_per_split=1)
    monkeypatch.setattr(CpuPlatform, "attention_backend", lambda self, spec: TritonPagedAttention(spec, policy))
    add_triton_on_cpu(sandbox, gemv_max_tokens=2)
    reset_plugin_manager()
    plans = []
    build_metadata = TritonPagedAttention.build_metadata

    def recording_build_metadata(self, batch):
        metadata = build_metadata(self, batch)
        plans.append(metadata.num_splits)
        return metadata

    monkeypatch.setattr(TritonPagedAttention, "build_metadata", recording_build_metadata)
    llm = make_llm(llama_dir, max_num_batched_tokens=5)  # the long prompt is chunked
    layer = llm.engine.executor.worker.runner.model.model.layers[0]
    assert isinstance(layer.self_attn.attn.backend, TritonPagedAttention)
    ops = layer.input_layernorm.ops
    assert ops.choice("rms_norm").impl == "triton" and ops.choice("fused_add_rms_norm").impl == "triton"
    # The decode steps run the GEMV, fused with the MLP's activation.
    assert ops.choice("linear").describe() == "linear: gemv [triton_on_cpu] up to 2 tokens, else reference"
    assert layer.mlp.linear_act_and_mul is ops.linear_silu_and_mul
    assert ops.choice("linear_silu_and_mul").fallback == "composed (linear, silu_and_mul)"
    outputs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert (max(plans) > 1) == (min_split_seq_len == 1)


def test_full_gpu_decode_batches_take_light_tiles():
    from octavo.kernels.split_kv_decode import DIRECT_DECODE_TILES, FULL_GPU_DECODE_TILES
    from octavo.runtime.attention.triton_plan import tiles_for_step

    policy = SplitKvPolicy()
    # Llama-3.1-8B (8 KV heads) on 132 SMs: 33 requests give 264 programs.
    assert not policy.fills_gpu(32, 8, 132) and policy.fills_gpu(33, 8, 132)
    assert tiles_for_step(1, 1, 128, gpu_is_full=True) == FULL_GPU_DECODE_TILES
    assert tiles_for_step(1, 1, 128, gpu_is_full=False) == DIRECT_DECODE_TILES


def test_split_threshold_from_environment(monkeypatch):
    assert SplitKvPolicy.from_env() == SplitKvPolicy()
    monkeypatch.setenv("OCTAVO_SPLIT_MIN_SEQ_LEN", "4096")
    assert SplitKvPolicy.from_env().min_seq_len == 4096
    monkeypatch.setenv("OCTAVO_SPLIT_MIN_SEQ_LEN", "lots")
    with pytest.raises(ValueError, match="OCTAVO_SPLIT_MIN_SEQ_LEN"):
        SplitKvPolicy.from_env()



def test_fp8_cache_prefill_attends_over_fresh_kv(device):
    """With an fp8 cache, a mixed step (through ``forward_with_rotary``, as the
    model calls it) writes the rotated keys to the cache, and attends over the
    context from the cache but its own tokens' rotated keys and values exact;
    a decode step keeps reading the cache, with the fp8 tiles."""
    import dataclasses

    from octavo.kernels.reference import paged_attention_reference
    from octavo.kernels.rotary import rotary_and_cache
    from octavo.kernels.split_kv_decode import default_decode_tiles
    from octavo.models.layers.rotary import RotaryEmbedding
    from octavo.ops.reference import rotary_embedding
    from octavo.runtime.attention.torch_paged import write_kv_cache

    batch_spec = BatchSpec(mixed_requests(), num_padding_tokens=2)
    batch = make_batch(batch_spec, device)
    spec = dataclasses.replace(attention_spec(batch_spec), kv_cache_dtype=torch.float8_e4m3fn)
    backend = TritonPagedAttention(spec)
    meta = backend.build_metadata(batch.attn_batch)
    b = batch.attn_batch
    lengths = zip(b.seq_lens_cpu.tolist(), b.query_start_loc_cpu.diff().tolist())
    positions = torch.cat([torch.arange(s - q, s) for s, q in lengths])
    positions = torch.cat([positions, torch.zeros(2, dtype=torch.int64)]).to(device)
    cos_sin = RotaryEmbedding(batch_spec.head_size, 128, 10000.0, None).cos_sin_cache.to(device)
    cache = batch.kv_cache.to(torch.float8_e4m3fn)
    expected_cache = cache.clone()
    q_rot, k_rot = rotary_embedding(positions, batch.query.clone(), batch.key.clone(), cos_sin)
    out = backend.forward_with_rotary(
        batch.query.clone(), batch.key.clone(), batch.value, cache, meta, positions, cos_sin, rotary_and_cache
    )
    write_kv_cache(k_rot, batch.value, expected_cache, b.slot_mapping)
    assert (cache.float() - expected_cache.float()).abs().max() <= 2**-3 * expected_cache.float().abs().max()
    seen = cache.float()
    write_kv_cache(k_rot, batch.value, seen, b.slot_mapping)
    expected = paged_attention_reference(q_rot, seen, b.query_start_loc, b.seq_lens, b.block_table, spec.scale)
    n = batch.num_actual_tokens
    torch.testing.assert_close(out[:n], expected[:n], atol=1e-5, rtol=1e-5)
    decode = make_batch(BatchSpec(decode_requests([300, 20])), device)
    decode_meta = backend.build_metadata(decode.attn_batch)
    assert not backend._attends_fresh(decode_meta)
    assert decode_meta.tiles == default_decode_tiles(decode_meta.num_splits > 1, fp8_cache=True)


def test_fresh_kv_over_a_16_bit_cache_matches_the_cache_path(device, monkeypatch):
    """``OCTAVO_PREFILL_FRESH_KV=1``: a mixed step over a full-precision cache
    attends over its own rotated K/V instead of reading them back; the cache
    it leaves and the output are those of the default path."""
    from octavo.kernels.rotary import rotary_and_cache
    from octavo.models.layers.rotary import RotaryEmbedding

    batch_spec = BatchSpec(mixed_requests(), num_padding_tokens=2)
    batch = make_batch(batch_spec, device)
    spec = attention_spec(batch_spec)
    b = batch.attn_batch
    lengths = zip(b.seq_lens_cpu.tolist(), b.query_start_loc_cpu.diff().tolist())
    positions = torch.cat([torch.arange(s - q, s) for s, q in lengths] + [torch.zeros(2, dtype=torch.int64)])
    cos_sin = RotaryEmbedding(batch_spec.head_size, 128, 10000.0, None).cos_sin_cache.to(device)
    results = []
    for fresh in ("0", "1"):
        monkeypatch.setenv("OCTAVO_PREFILL_FRESH_KV", fresh)
        backend = TritonPagedAttention(spec)
        meta = backend.build_metadata(b)
        assert backend._attends_fresh(meta) == (fresh == "1")
        cache = batch.kv_cache.clone()
        out = backend.forward_with_rotary(
            batch.query.clone(), batch.key.clone(), batch.value, cache, meta, positions.to(device), cos_sin,
            rotary_and_cache,
        )
        results.append((out[: batch.num_actual_tokens], cache))
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    monkeypatch.setenv("OCTAVO_PREFILL_FRESH_KV", "yes")
    with pytest.raises(InvalidArgumentError, match="OCTAVO_PREFILL_FRESH_KV"):
        TritonPagedAttention(spec)
