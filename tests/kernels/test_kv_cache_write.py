"""reshape_and_cache against the reference writer, padding slots included."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from octavo.kernels.kv_cache_write import reshape_and_cache  # noqa: E402
from octavo.kernels.reference import reshape_and_cache_reference  # noqa: E402
from tests.kernels.tolerances import assert_same_rounding  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_write_skips_negative_slots(dtype, device):
    generator = torch.Generator().manual_seed(0)
    num_blocks, block_size, num_kv_heads, head_size = 6, 16, 2, 32
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=generator).to(dtype).to(device)
    expected = cache.clone()
    # A fused qkv output: key and value are strided views of it.
    qkv = torch.randn(7, 3 * num_kv_heads * head_size, generator=generator).to(dtype).to(device)
    key = qkv[:, num_kv_heads * head_size : 2 * num_kv_heads * head_size].view(7, num_kv_heads, head_size)
    value = qkv[:, 2 * num_kv_heads * head_size :].view(7, num_kv_heads, head_size)
    slots = torch.tensor([5, 17, -1, 95, 40, -1, 0], dtype=torch.int64, device=device)
    reshape_and_cache(key, value, cache, slots)
    reshape_and_cache_reference(key, value, expected, slots)
    assert torch.equal(cache, expected)
    # The padding tokens' values went nowhere: only 5 slots changed per half.
    assert torch.equal(cache[0].reshape(-1, num_kv_heads, head_size)[95], key[3])


def test_write_casts_to_the_cache_dtype(device):
    cache = torch.zeros(2, 2, 16, 1, 16, dtype=torch.bfloat16, device=device)
    key = torch.randn(3, 1, 16, device=device)
    value = torch.randn(3, 1, 16, device=device)
    slots = torch.tensor([3, -7, 20], dtype=torch.int64, device=device)
    reshape_and_cache(key, value, cache, slots)
    flat_values = cache[1].reshape(-1, 1, 16)
    assert_same_rounding(flat_values[20], value[2].to(torch.bfloat16))
    assert int((cache != 0).any(-1).sum()) == 4  # two slots, key and value each
