"""One token's activations quantized to int8 per block, four values a word,
for the ``dp4a`` GEMVs (``int4_gemv_dp4a``, ``gguf_q4k_dp4a``).

A block of ``size`` inputs gets the scale ``amax / 127`` (its absolute
maximum maps to 127; an all-zero block scale 0) and each value
``floor(x * 127 / amax + 0.5)``, in ``[-127, 127]``. The block's values are
packed four to an int32 word in the order its GEMV's weights need
(``ActivationOrder``): byte ``l`` of word ``c`` holds input
``c * word_stride + l * byte_stride`` of the block. Besides the words, the
blocks' scales (float32) and their values' sums (int32, for zero points and
mins: ``sum (q - z) x8 = sum q x8 - z sum x8``). One launch, a program per
few blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait


@dataclass(frozen=True)
class ActivationOrder:
    size: int  # inputs a block (one scale)
    word_stride: int  # inputs from word c to word c + 1 of a block
    byte_stride: int  # inputs from byte l to byte l + 1 of a word

    @property
    def words(self) -> int:
        return self.size // 4


# Octavo's int4 layout: word i of a 128-input block holds input i + 16 j in nibble j, so its
# low nibbles (bytes) meet inputs c + 32 l for c = i, its high ones c = 16 + i.
INT4_ORDER = ActivationOrder(size=128, word_stride=1, byte_stride=32)
# ggml's blocks of 32 (Q8_1's): four consecutive inputs a word.
NATURAL_32 = ActivationOrder(size=32, word_stride=4, byte_stride=1)
PROGRAM_BLOCKS = 4  # blocks a program


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, scale_ptr, sum_ptr, group_scale_ptr, group_sum_ptr, num_blocks,
                     SIZE: tl.constexpr, WORDS: tl.constexpr, WORD_STRIDE: tl.constexpr, BYTE_STRIDE: tl.constexpr,
                     BLOCKS: tl.constexpr, GROUP: tl.constexpr, PDL: tl.constexpr):
    """``BLOCKS`` blocks a program, ``x`` viewed ``[block, word c, byte l]``; with ``GROUP``
    words (0: none) also each group's block scale and its values' sum times it (float32)."""
    blocks = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    valid = blocks < num_blocks
    word = tl.arange(0, WORDS)
    byte = tl.arange(0, 4)
    inputs = word[:, None] * WORD_STRIDE + byte[None, :] * BYTE_STRIDE
    pdl_wait(PDL)  # x comes from the kernel before
    x = tl.load(x_ptr + blocks[:, None, None] * SIZE + inputs[None], mask=valid[:, None, None], other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)
    inverse = tl.where(amax > 0.0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    values = tl.floor(x * inverse[:, None, None] + 0.5).to(tl.int32)
    pdl_release(PDL)
    word_sums = tl.sum(values, axis=2)
    sums = tl.sum(word_sums, axis=1)
    words = tl.sum((values & 0xFF) << (byte * 8)[None, None, :], axis=2)  # disjoint bits: the sum is the OR
    tl.store(q_ptr + blocks[:, None] * WORDS + word[None, :], words, mask=valid[:, None])
    scales = amax / 127.0
    if GROUP > 0:
        GROUPS: tl.constexpr = WORDS // GROUP
        group_sums = tl.sum(tl.reshape(word_sums, (BLOCKS, GROUPS, GROUP)), axis=2)
        group = tl.arange(0, GROUPS)
        offsets = blocks[:, None] * GROUPS + group[None, :]
        tl.store(group_scale_ptr + offsets, tl.broadcast_to(scales[:, None], (BLOCKS, GROUPS)), mask=valid[:, None])
        tl.store(group_sum_ptr + offsets, group_sums.to(tl.float32) * scales[:, None], mask=valid[:, None])
    tl.store(scale_ptr + blocks, scales, mask=valid)
    tl.store(sum_ptr + blocks, sums, mask=valid)


def quantize(x: torch.Tensor, order: ActivationOrder, group_words: int = 0) -> tuple[torch.Tensor, ...]:
    """One token ``x [1, K]`` (K a multiple of ``order.size``) -> int8 words ``[K / size, size / 4]``
    (int32), block scales ``[K / size]`` (float32) and the blocks' sums ``[K / size]`` (int32);
    with ``group_words`` also, per group of that many consecutive words, its block's scale and
    its values' sum times that scale (float32 ``[K / size, size / 4 / group_words]``)."""
    num_blocks = x.shape[1] // order.size
    words = torch.empty(num_blocks, order.words, dtype=torch.int32, device=x.device)
    scales = torch.empty(num_blocks, dtype=torch.float32, device=x.device)
    sums = torch.empty(num_blocks, dtype=torch.int32, device=x.device)
    groups = [torch.empty(num_blocks, order.words // group_words, dtype=torch.float32, device=x.device)
              for _ in range(2 if group_words else 0)]
    group_scales, group_sums = groups or (scales, scales)
    pdl = pdl_enabled(x.device, 1)
    _quantize_kernel[(triton.cdiv(num_blocks, PROGRAM_BLOCKS),)](
        x, words, scales, sums, group_scales, group_sums, num_blocks, SIZE=order.size, WORDS=order.words,
        WORD_STRIDE=order.word_stride, BYTE_STRIDE=order.byte_stride, BLOCKS=PROGRAM_BLOCKS, GROUP=group_words,
        PDL=pdl, num_warps=1, launch_pdl=pdl)
    return (words, scales, sums, *groups)


def quantize_reference(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain-torch ``quantize``: int8 values ``[K / size, size]`` in input order (int32), scales, sums."""
    blocks = x.float().reshape(-1, size)
    amax = blocks.abs().amax(dim=1)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    values = torch.floor(blocks * inverse[:, None] + 0.5).to(torch.int32)
    return values, amax / 127.0, values.sum(dim=1, dtype=torch.int32)


def unpack_words(words: torch.Tensor, order: ActivationOrder) -> torch.Tensor:
    """Inverse of the packing: words ``[blocks, size / 4]`` -> values ``[blocks, size]`` in input order."""
    signed = torch.stack([(words << (24 - 8 * byte)) >> 24 for byte in range(4)], dim=2)  # [block, c, l]
    word = torch.arange(order.words)[:, None] * order.word_stride
    byte = torch.arange(4)[None, :] * order.byte_stride
    values = torch.empty(words.shape[0], order.size, dtype=torch.int32)
    values[:, (word + byte).reshape(-1)] = signed.reshape(words.shape[0], -1)
    return values
