"""The int4 tensor-core GEMM with the zero point and scale left out of the
tile (issue 17): ``GroupedMmConfig.pairs == 2``.

The pairs tile (``int4_pairs_tile``) still spends two ``bf16x2`` FMAs a pair
taking the zero off and scaling. For one 128-input block ``b`` (one group)
of a row ``n``::

    sum_k x_k (q_k - z) s = s (sum_k x_k (128 + q_k) - (128 + z) sum_k x_k)

so each K step multiplies the activations by the bare ``128 + q`` tile (one
``lop3`` a pair, exact in bfloat16) on the tensor cores in float32, and then
applies, per output, ``acc += s (p - (128 + z) xsum)`` with the block's
activation sum: two FMAs an output a step instead of two a weight pair. The
products are exact and summed in float32, so the result is nearer the
dequantized float32 product than the bfloat16-weight path (the 128 x
cancellation costs 7 of float32's 24 bits). One 128-input block a K step
(``block_k`` is 128 here); activations in pair-major order (``pair_major``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.kernels.quant.int4_pairs_tile import OFFSET_WORD_ASM
from octavo.kernels.tile_order import program_tile


@triton.jit
def _biased(words, SHIFT: tl.constexpr):
    """``128 + q`` of the nibble at bit ``SHIFT``, bfloat16 (exact)."""
    return (((words >> SHIFT) & 15).to(tl.float32) + 128.0).to(tl.bfloat16)


@triton.jit
def _offset_tile(w_ptr, rows, stride_wn, k0, BLOCK_N: tl.constexpr, ASM: tl.constexpr):
    """One 128-input block of rows ``rows`` as bfloat16 ``128 + q``, pair-major: ``[BLOCK_N, 128]``."""
    words = tl.load(w_ptr + rows[:, None] * stride_wn + k0 // 8 + tl.arange(0, 16)[None, :]).to(tl.uint32,
                                                                                                 bitcast=True)
    if ASM:
        lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3 = tl.inline_asm_elementwise(
            OFFSET_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:  # the plain twin (the interpreter)
        lo0, lo1, lo2, lo3 = _biased(words, 0), _biased(words, 4), _biased(words, 8), _biased(words, 12)
        hi0, hi1, hi2, hi3 = _biased(words, 16), _biased(words, 20), _biased(words, 24), _biased(words, 28)
    low = tl.join(tl.join(lo0, lo2), tl.join(lo1, lo3))
    high = tl.join(tl.join(hi0, hi2), tl.join(hi1, hi3))
    return tl.reshape(tl.join(low, high), (BLOCK_N, 128))


@triton.jit(do_not_specialize=["M"])
def _offset_mm_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
    stride_xm, stride_wn, stride_sn, stride_zn, stride_om, stride_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, ASM: tl.constexpr,
):
    offs_m, offs_n, mask_m, mask_n, rows_m, rows_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    num_steps = K // 128
    per_split = tl.cdiv(num_steps, SPLIT_K)
    first_step = tl.program_id(1) * per_split
    last_step = tl.minimum(first_step + per_split, num_steps)
    offs_k = tl.arange(0, 128)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(first_step, last_step):
        k0 = step * 128
        x = tl.load(x_ptr + rows_m[:, None] * stride_xm + k0 + offs_k[None, :])
        tile = _offset_tile(w_ptr, rows_n, stride_wn, k0, BLOCK_N, ASM)
        group = k0 // group_size
        scale = tl.load(s_ptr + rows_n * stride_sn + group).to(tl.float32)
        offset = tl.load(z_ptr + rows_n * stride_zn + group).to(tl.float32) + 128.0
        products = tl.dot(x.to(DOT_DTYPE), tl.trans(tile.to(DOT_DTYPE)), input_precision=PRECISION)
        x_sum = tl.sum(x.to(tl.float32), axis=1)
        acc += (products - x_sum[:, None] * offset[None, :]) * scale[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows_n).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # float32 partials [SPLIT_K, M, N]: int4_mm_triton's _sum_splits_kernel finishes
        partial = out_ptr + tl.program_id(1) * stride_split + offs_m[:, None] * N + offs_n[None, :]
        tl.store(partial, acc, mask=mask)
