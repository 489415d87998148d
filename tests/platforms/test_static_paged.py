"""The static-shape paged attention backend (TPU's) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from octavo.core.attention import AttentionBatch, AttentionSpec
from octavo.runtime.attention.static_paged import StaticPagedAttention, bucket
from octavo.runtime.attention.torch_paged import TorchPagedAttention
from octavo.testing.conformance.batches import mixed_scenario, run_scenario

CPU = torch.device("cpu")


def spec_of(num_heads, num_kv_heads, head_size, window=None, dtype=torch.float32, block_size=16) -> AttentionSpec:
    return AttentionSpec(num_heads, num_kv_heads, head_size, head_size**-0.5, dtype, dtype, block_size, window)


def test_bucket():
    assert [bucket(n) for n in (0, 1, 2, 3, 5, 16, 17)] == [1, 1, 2, 4, 8, 16, 32]
    assert [bucket(n, 16) for n in (1, 16, 17, 40)] == [16, 16, 32, 64]
    assert bucket(5, 24) == 24


@pytest.mark.parametrize(
    "shape", [(4, 4, 32, None), (8, 2, 64, None), (4, 1, 16, 8)], ids=["mha", "gqa", "mqa-window"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matches_the_reference_on_mixed_batches(shape, dtype):
    spec = spec_of(*shape, dtype=dtype)
    scenario = mixed_scenario(spec, seed=3)
    ours = run_scenario(scenario, StaticPagedAttention(spec), CPU)
    reference = run_scenario(scenario, TorchPagedAttention(spec), CPU)
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    for step, (a, b) in enumerate(zip(ours, reference)):
        assert torch.allclose(a, b, atol=atol), f"step {step}: max error {(a - b).abs().max():.2e}"


def _batch(device, num_padding: int = 0, write: bool = True) -> AttentionBatch:
    """Two requests (3 new tokens after 13 cached; 1 decode after 30), plus padding tokens."""
    slots = [13, 14, 15] + [4 * 16 + 14] if write else [-1] * 4
    slots = slots + [-1] * num_padding
    query_start = torch.tensor([0, 3, 4], dtype=torch.int32)
    seq_lens = torch.tensor([16, 31], dtype=torch.int32)
    return AttentionBatch(
        query_start_loc=query_start.to(device),
        seq_lens=seq_lens.to(device),
        block_table=torch.tensor([[0, 0], [3, 4]], dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        num_reqs=2,
        num_actual_tokens=4,
        max_query_len=3,
        max_seq_len=31,
        query_start_loc_cpu=query_start,
        seq_lens_cpu=seq_lens,
    )


@pytest.mark.parametrize("write", [True, False], ids=["write", "profile-step"])
def test_padding_tokens_write_nothing_and_output_zeros(write):
    spec = spec_of(4, 2, 16)
    torch.manual_seed(0)
    num_tokens = 4 + 3
    q, k, v = torch.randn(num_tokens, 4, 16), torch.randn(num_tokens, 2, 16), torch.randn(num_tokens, 2, 16)
    base = torch.randn(2, 8, 16, 2, 16)
    ours_cache, ref_cache = base.clone(), base.clone()
    backend, reference = StaticPagedAttention(spec), TorchPagedAttention(spec)
    ours = backend.forward(q, k, v, ours_cache, backend.build_metadata(_batch(CPU, 3, write)))
    ref = reference.forward(q, k, v, ref_cache, reference.build_metadata(_batch(CPU, 3, write)))
    assert torch.equal(ours_cache, ref_cache)  # same slots written, nothing else touched
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.count_nonzero(ours[4:]) == 0


def test_no_host_reads_and_no_data_dependent_shapes():
    # On the meta device any read of a tensor's value, and any shape that
    # depends on one (boolean indexing, nonzero), raises.
    spec = spec_of(4, 2, 16)
    meta = torch.device("meta")
    q, k, v = torch.empty(7, 4, 16, device=meta), torch.empty(7, 2, 16, device=meta), torch.empty(7, 2, 16, device=meta)
    cache = torch.empty(2, 8, 16, 2, 16, device=meta)
    backend = StaticPagedAttention(spec)
    out = backend.forward(q, k, v, cache, backend.build_metadata(_batch(meta, num_padding=3)))
    assert out.shape == (7, 4, 16) and out.device == meta
    reference = TorchPagedAttention(spec)
    with pytest.raises((RuntimeError, NotImplementedError)):  # the reference reads device values
        reference.forward(q, k, v, cache, reference.build_metadata(_batch(meta, num_padding=3)))


def test_batches_in_one_bucket_share_every_shape():
    spec = spec_of(4, 2, 16)
    backend = StaticPagedAttention(spec)
    first = backend.build_metadata(_batch(CPU))
    other = _batch(CPU)
    other.max_seq_len, other.max_query_len = 20, 4  # same buckets (32, 4)
    other.seq_lens = torch.tensor([17, 20], dtype=torch.int32)
    second = backend.build_metadata(other)
    for name in ("query_index", "query_valid", "query_pos", "key_slots", "key_valid"):
        assert getattr(first.padded, name).shape == getattr(second.padded, name).shape
    assert first.padded.key_slots.shape == (2, 32)


def test_end_to_end_on_cpu_matches_hugging_face(tmp_path, fresh_plugins, monkeypatch, caplog):
    from octavo.platforms.cpu import CpuPlatform
    from octavo.testing.conformance.model import build_tiny_llama, compare_with_hf

    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "static_paged")
    with caplog.at_level("INFO", logger="octavo.platforms.attention_selection"):
        summary = compare_with_hf(CpuPlatform(), build_tiny_llama(tmp_path / "tiny-llama"), torch.float32)
    assert "cpu: attention backend static_paged (requested by OCTAVO_ATTENTION_BACKEND)" in caplog.messages
    assert summary.startswith("float32: 7/7 prompts token-identical to HF")
