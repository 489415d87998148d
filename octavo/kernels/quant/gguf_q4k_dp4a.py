"""The one-token GGUF Q4_K GEMV on 8-bit dot products (``dp4a``), activations
in int8 per block of 32 as llama.cpp's decode takes them (W4A8, opt-in;
issue 17).

A Q4_K super-block (``gguf_q4k_pairs``: float16 ``d`` and ``dmin``, 6-bit
(scale, min) for eight 32-value sub-blocks, four 64-value chunks of nibbles)
keeps, in byte ``l`` of chunk ``a``, value ``64 a + l`` of sub-block ``2 a``
in the low nibble and value ``64 a + 32 + l`` of sub-block ``2 a + 1`` in the
high one: a 32-bit word's low nibbles are four consecutive values of one
sub-block, its high nibbles the four 32 further on. The token is first
quantized to int8 per 32 inputs in natural order (``int8_activations``,
``NATURAL_32``), so each weight word meets two activation words, and one
``and``, a shift, one more ``and`` and two ``dp4a`` give its two exact int32
sums of ``q x8`` (``_WORD_DOTS_ASM``). The words go as eight quarters of
four (a thread's vector load): a thread sums its four words' dot products in
int32 (no shuffle), then adds ``d sc dx sum(q x8) - dmin mn dx sum(x8)`` for
the quarter's two sub-blocks: the scales and mins decoded from the header at
the quarters' shape (``gguf_q4k_pairs._chunk_scales``), the activations' block
scale and scaled sum read per group of four words (``group_words=4``).

sm_90 SASS at (8, 4, 4) (``tests/kernels/sass_loops.py``): 2.7 instructions a
weight value, barrier-free, against 5.4 for the bfloat16-pairs kernel (whose
scale decode, shared, went from 5.8 to 5.4 with the two sub-blocks' 6-bit
fields decoded in one word's two bytes). On an H100 it is nevertheless
slower than the pairs kernel (round 42: 96.5 against 75.2 us an 8B layer;
four activation loads a quarter besides the weights' words, and the
activations' own launch). What changes against the bfloat16 reference is
each activation's rounding to its block's int8 grid (half a step,
``amax / 254``, at most). ``OCTAVO_GGUF_Q4K_DP4A=1`` takes it; off by
default, kept for the H200's figure.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from octavo.env_switches import switch_from_env
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.quant import int8_activations
from octavo.kernels.quant.bf16_pairs import rows_load_as_words
from octavo.kernels.quant.gguf_q4k_pairs import _SB_BYTES, SB_BYTES, _chunk_scales
from octavo.kernels.quant.int4_gemv_dp4a import Dp4aTiles, _dp4a_twin, dp4a_tiles_from_env
from octavo.kernels.quant.int8_activations import NATURAL_32
from octavo.kernels.triton_utils import interpreting, runs_ptx

# Swept on an H100 (round 42, one 8B layer's four GEMVs with the activations' launch): 117.4 us
# at (4, 4, 4), 116.5 at (4, 2, 2), 126.8 at the pairs GEMV's (8, 4, 4).
TILES = Dp4aTiles(block_n=4, split=4, num_warps=4)


@functools.cache
def tiles_from_env() -> Dp4aTiles | None:
    """``OCTAVO_GGUF_Q4K_DP4A_TILES=block_n,split,num_warps`` (tuning runs), else None."""
    return dp4a_tiles_from_env("OCTAVO_GGUF_Q4K_DP4A_TILES")


@functools.cache
def dp4a_enabled() -> bool:
    """``OCTAVO_GGUF_Q4K_DP4A=1`` sends one-token Q4_K calls here (W4A8); off by default."""
    return switch_from_env("OCTAVO_GGUF_Q4K_DP4A", default=False)


# $2 the weights' word, $3 / $4 the activation words of its low / high nibbles:
# $0 / $1 the int32 sums of q x8 over the low / high nibbles.
_WORD_DOTS_ASM = tl.constexpr("""{
.reg .b32 lo, hi;
and.b32 lo, $2, 0x0F0F0F0F;
shr.u32 hi, $2, 4;
and.b32 hi, hi, 0x0F0F0F0F;
dp4a.u32.s32 $0, lo, $3, 0;
dp4a.u32.s32 $1, hi, $4, 0;
}""")


@triton.jit
def _word_dots(words, a_words, b_words, ASM: tl.constexpr):
    """Each word's ``sum q x8`` over its low nibbles (with ``a_words``) and its high ones
    (``b_words``), int32."""
    if ASM:
        return tl.inline_asm_elementwise(_WORD_DOTS_ASM, "=r,=r,r,r,r", [words, a_words, b_words],
                                         dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    return _dp4a_twin(words & 0x0F0F0F0F, a_words), _dp4a_twin((words >> 4) & 0x0F0F0F0F, b_words)


@triton.jit
def _q4k_dp4a_kernel(
    q_ptr, gs_ptr, gsum_ptr, w_ptr, out_ptr, N, K, row_bytes,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = w_ptr + tl.where(mask_n, offs_n, 0).to(tl.int64) * row_bytes  # [BLOCK_N] byte pointers
    # A super-block's 32 words of nibbles as 8 quarters of 4 (a thread's vector load): quarter
    # q is half q % 2 of chunk q // 2, its low nibbles 16 values of sub-block 2 (q // 2).
    quarter = tl.arange(0, 8)[None, None, :]  # [1, 1, 8]
    word = tl.arange(0, 4)[None, None, None, :]  # [1, 1, 1, 4]
    steps = tl.arange(0, SPLIT)
    num_sb = K // 256
    acc = tl.zeros((BLOCK_N, SPLIT, 8), dtype=tl.float32)
    pdl_wait(PDL)  # the activations' words come from int8_activations.quantize, the kernel before
    for sb0 in range(0, num_sb, SPLIT):
        # Super-blocks past the row's end read super-block 0 with zero scales.
        live = sb0 + steps < num_sb
        sb = tl.where(live, sb0 + steps, 0)
        sb_words = (rows[:, None] + (sb * _SB_BYTES)[None, :]).to(tl.pointer_type(tl.uint32))[:, :, None]
        s_lo, m_lo, s_hi, m_hi = _chunk_scales(sb_words, live[None, :, None], quarter // 2)  # [BLOCK_N, SPLIT, 8]
        words = tl.load((sb_words + 4 + 4 * quarter)[:, :, :, None] + word)
        # The low nibbles' activation words: 64 sb + 16 (q // 2) + 4 (q % 2) + w; the high's 8 on.
        a_index = (64 * sb)[None, :, None] + 16 * (quarter // 2) + 4 * (quarter % 2)  # [1, SPLIT, 8]
        x_index = tl.broadcast_to(a_index[:, :, :, None] + word, (BLOCK_N, SPLIT, 8, 4))
        dot_lo, dot_hi = _word_dots(words, tl.load(q_ptr + x_index), tl.load(q_ptr + x_index + 8), ASM)
        # A thread's four words summed in int32 (its own vector: no shuffle), then the quarter's
        # activation scale and scaled sum (per group of four words, 16 values) at the sums' shape.
        group = tl.broadcast_to(a_index // 4, (BLOCK_N, SPLIT, 8))
        acc += (s_lo * tl.load(gs_ptr + group)) * tl.sum(dot_lo, axis=3).to(tl.float32)
        acc += (s_hi * tl.load(gs_ptr + group + 2)) * tl.sum(dot_hi, axis=3).to(tl.float32)
        acc -= m_lo * tl.load(gsum_ptr + group) + m_hi * tl.load(gsum_ptr + group + 2)
    pdl_release(PDL)
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(out_ptr + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def takes(x: torch.Tensor, raw: torch.Tensor, type_name: str) -> bool:
    """Switched on, one token of a Q4_K weight whose rows load as 32-bit words, where the PTX
    runs (the interpreter runs the twin)."""
    return (type_name == "Q4_K" and dp4a_enabled() and x.shape[0] == 1 and (runs_ptx(x.device) or interpreting())
            and rows_load_as_words(raw, 4))


def q4k_gemv_dp4a(x: torch.Tensor, raw: torch.Tensor, tiles: Dp4aTiles | None = None) -> torch.Tensor:
    """``x @ W.T`` for one token (``takes``) and raw Q4_K rows ``[N, row_bytes]``: two launches,
    ``int8_activations.quantize`` then the GEMV."""
    num_out, row_bytes = raw.shape
    tiles = tiles or tiles_from_env() or TILES
    out = torch.empty(1, num_out, dtype=x.dtype, device=x.device)
    if num_out == 0:
        return out
    x_words, _, _, group_scales, group_sums = int8_activations.quantize(x, NATURAL_32, group_words=4)
    pdl = pdl_enabled(x.device, 1)
    _q4k_dp4a_kernel[(triton.cdiv(num_out, tiles.block_n),)](
        x_words, group_scales, group_sums, raw, out, num_out, row_bytes // SB_BYTES * 256, raw.stride(0),
        BLOCK_N=tiles.block_n, SPLIT=tiles.split, ASM=runs_ptx(x.device), PDL=pdl, num_warps=tiles.num_warps,
        launch_pdl=pdl,
    )
    return out
