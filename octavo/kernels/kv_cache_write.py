"""Write a step's keys and values into the paged KV cache (reshape_and_cache).

Program ``t`` copies token ``t``'s key and value ([num_kv_heads, head_size]
each) to slot ``slot_mapping[t]`` = ``block_id * block_size + offset`` of the
cache ``[2, num_blocks, block_size, num_kv_heads, head_size]``. A negative
slot marks a padding token (CUDA graphs pad batches): nothing is written, so
the grid may cover more tokens than the step really has. Values are
multiplied by ``k_scale_inv`` / ``v_scale_inv`` (1 / the layer's fp8 KV
scales; 1.0 otherwise, which changes nothing) in float32 and cast to the
cache's dtype.

Reference: ``octavo.kernels.reference.reshape_and_cache_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.kernels.fp8_cast import cast_to, pre_round
from octavo.kernels.triton_utils import next_power_of_2


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, k_scale_inv, v_scale_inv,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_block, stride_slot, stride_head,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, PRE_ROUND: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_SIZE)[None, :]
    dest = (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_slot
    dest_offsets = dest + heads[:, None] * stride_head + dims[None, :]
    key = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    value = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    key = cast_to(key.to(tl.float32) * k_scale_inv, k_cache_ptr.dtype.element_ty, PRE_ROUND)
    value = cast_to(value.to(tl.float32) * v_scale_inv, v_cache_ptr.dtype.element_ty, PRE_ROUND)
    tl.store(k_cache_ptr + dest_offsets, key, mask=mask)
    tl.store(v_cache_ptr + dest_offsets, value, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store ``key / k_scale`` and ``value / v_scale`` ([T, Hkv, D]) at
    ``slot_mapping[:T]``; negative slots are skipped."""
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    if key.stride(2) != 1 or value.stride(2) != 1:
        key, value = key.contiguous(), value.contiguous()
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping, 1.0 / k_scale, 1.0 / v_scale,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=next_power_of_2(num_kv_heads),
        HEAD_SIZE=head_size, HEAD_PAD=next_power_of_2(head_size), BLOCK_SIZE=key_cache.shape[1],
        PRE_ROUND=pre_round(), num_warps=4,
    )
