"""The int4 GEMV for one token with whole groups, its loop free of barriers
and of bit-field extracts (issue 17).

Octavo's layout (``int4``) packs a block of 128 inputs of a row into 16
words, plane ``j`` of word ``i`` holding input ``i + 16 j``. A program takes
``BLOCK_N`` rows and steps through K ``SPLIT`` blocks at a time: the words
as ``[BLOCK_N, SPLIT, 16]`` (Triton lays threads along the 16 lanes, then the
blocks, then the rows), each plane's activations as a ``[SPLIT, 16]`` vector
broadcast over the rows, so nothing changes layout through shared memory in
the loop (the shared form of ``int4_triton`` had 16 barriers a step). With
more rows than a warp's 8 a thread holds several rows sharing its
activations in registers, but the GPU prefers one row a thread and more
programs (``TILES``): what pays is the cheaper value and the missing
barriers, not the reuse.

A value becomes a float with one instruction: a byte of the word is
shifted down once, then ``lop3`` masks one nibble and ORs in the exponent
(``0x4B000000``: ``2**23 + q``, or ``2**23 + 16 q`` for the byte's high
nibble, whose activation is divided by 16 instead). Written as ``&`` and
``|`` in Triton, LLVM turns each mask into a bit-field extract (two
instructions, then the OR): the ``lop3`` is inline PTX on CUDA, the plain
expression elsewhere (the interpreter, ROCm). The zero is subtracted from
each value (``2**23 + zero`` exactly, in float32) before its product: the
sum must not carry the ``2**23`` offsets. sm_90 SASS of the loop
(``tests/kernels/sass_loops.py``): 5.4-7.7 instructions a weight value by
tiles (7.7 at the default, one row a thread), none of them barriers,
against 9.5 with 16 barriers for the shared form.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.triton_utils import interpreting, ints_from_env


@dataclass(frozen=True)
class RowsTiles:
    block_n: int  # rows a program
    split: int  # consecutive 128-input blocks a step, one per slice (warps along them)
    num_warps: int


# Swept on an H100 (round 33, one 8B layer's four GEMVs, L2 flushed, graphs):
# 103.6 us at (8, 8, 8) against 112.3 at (8, 4, 4), 131.5 at (16, 4, 4) (two
# rows a thread: fewer programs, fewer loads in flight) and 130.6 for the
# shared form; torch's tinygemm 95.9. One row a thread wins: parallelism over
# activation reuse.
TILES = RowsTiles(block_n=8, split=8, num_warps=8)


@functools.cache
def tiles_from_env() -> RowsTiles | None:
    """``OCTAVO_INT4_GEMV_ROWS_TILES=block_n,split,num_warps`` (tuning runs), else None."""
    parts = ints_from_env("OCTAVO_INT4_GEMV_ROWS_TILES", "block_n,split,num_warps", (3,))
    return None if parts is None else RowsTiles(*parts)


@triton.jit
def _nibble_bits(t, HIGH: tl.constexpr, ASM: tl.constexpr):
    """float32 bits of ``2**23 + (t & 15)``, or with ``HIGH`` of ``2**23 + (t & 240)``
    (16 times the byte's high nibble): ``lop3`` with mask and exponent."""
    if ASM:
        if HIGH:
            asm: tl.constexpr = "lop3.b32 $0, $1, 240, 1258291200, 0xEA;"
        else:
            asm: tl.constexpr = "lop3.b32 $0, $1, 15, 1258291200, 0xEA;"
        return tl.inline_asm_elementwise(asm, "=r,r", [t], dtype=tl.uint32, is_pure=True, pack=1)
    if HIGH:
        return (t & 0xF0) | 0x4B000000
    return (t & 0x0F) | 0x4B000000


@triton.jit
def _int4_gemv_rows_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, N, K, group_size, stride_wn, stride_sn, stride_zn,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr,
):
    P: tl.constexpr = 16
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    # Out-of-range rows read row 0 instead of masking every load; 64-bit row offsets.
    rows = tl.where(mask_n, offs_n, 0).to(tl.int64)
    lanes = tl.arange(0, P)
    # A step takes SPLIT consecutive blocks. Shapes are [rows, blocks, lanes]: Triton lays threads
    # along the lanes, then the blocks, then the rows, so that a thread's rows share its activations.
    splits = tl.arange(0, SPLIT) * (P * 8)
    w_rows = w_ptr + rows[:, None, None] * stride_wn + lanes[None, None, :]
    acc = tl.zeros((BLOCK_N, SPLIT, P), dtype=tl.float32)
    pdl_wait(PDL)  # the activations come from the kernel before (octavo/kernels/pdl.py)
    for k0 in range(0, K, SPLIT * P * 8):
        block_start = k0 + splits  # [SPLIT]
        valid = block_start < K
        words = tl.load(w_rows + (block_start // 8)[None, :, None], mask=valid[None, :, None], other=0)
        words = words.to(tl.uint32, bitcast=True)
        group = (block_start // group_size)[None, :]
        scale = tl.load(s_ptr + rows[:, None] * stride_sn + group, mask=valid[None, :], other=0.0).to(tl.float32)
        zero = tl.load(z_ptr + rows[:, None] * stride_zn + group, mask=valid[None, :], other=0).to(tl.float32)
        offset_low = (zero + 8388608.0)[:, :, None]
        offset_high = (zero * 16.0 + 8388608.0)[:, :, None]
        block_sum = tl.zeros((BLOCK_N, SPLIT, P), dtype=tl.float32)
        x_block = x_ptr + block_start[:, None] + lanes[None, :]
        for b in tl.static_range(4):
            t = words >> (8 * b)
            x_low = tl.load(x_block + (2 * b) * P, mask=valid[:, None], other=0.0).to(tl.float32)
            x_high = tl.load(x_block + (2 * b + 1) * P, mask=valid[:, None], other=0.0).to(tl.float32) * 0.0625
            low = _nibble_bits(t, False, ASM).to(tl.float32, bitcast=True)
            high = _nibble_bits(t, True, ASM).to(tl.float32, bitcast=True)
            block_sum += x_low[None, :, :] * (low - offset_low)
            block_sum += x_high[None, :, :] * (high - offset_high)
        acc += block_sum * scale[:, :, None]
    pdl_release(PDL)
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows).to(tl.float32)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def takes(num_tokens: int, num_in: int, group_size: int, bits: int) -> bool:
    """Whether this kernel computes the call: one token, 4 bits, whole 128-input blocks per group."""
    return num_tokens == 1 and bits == 4 and num_in % 128 == 0 and group_size % 128 == 0


def int4_gemv_rows(x, qweight, scales, zeros, group_size: int, bias, tiles: RowsTiles | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for one token (``takes``) in Octavo's grouped int4 layout."""
    num_in, num_out = x.shape[1], qweight.shape[0]
    tiles = tiles or tiles_from_env() or TILES
    out = torch.empty(1, num_out, dtype=x.dtype, device=x.device)
    if num_out == 0:
        return out
    pdl = pdl_enabled(x.device, 1)
    asm = x.device.type == "cuda" and torch.version.hip is None and not interpreting()
    _int4_gemv_rows_kernel[(triton.cdiv(num_out, tiles.block_n),)](
        x, qweight, scales, zeros, bias if bias is not None else x, out, num_out, num_in, group_size,
        qweight.stride(0), scales.stride(0), zeros.stride(0),
        BLOCK_N=tiles.block_n, SPLIT=tiles.split, HAS_BIAS=bias is not None, ASM=asm, PDL=pdl,
        num_warps=tiles.num_warps, launch_pdl=pdl,
    )
    return out
