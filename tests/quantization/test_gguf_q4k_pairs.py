"""The one-token Q4_K GEMV in bfloat16 pairs (``gguf_q4k_pairs``) under Triton's
interpreter, which runs its plain-arithmetic twin (the PTX is compiled for sm_90
in ``test_triton_compile.py`` and timed on the GPU): partial row tiles, a step
past the row's last super-block, and the layer op's dispatch to it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, dequantize_gguf, random_gguf_rows  # noqa: E402
from octavo.kernels.quant.gguf_q4k_pairs import _chunk_scales  # noqa: E402
from tests.quantization.helpers import check_pairs_dispatch, relative_error  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402

Q4_K = GGML_TYPES_BY_NAME["Q4_K"]


@not_interpreted
def test_q4k_pairs_under_interpreter():
    rerun_under_interpreter(__file__)


# (rows, inputs, tiles): a partial row tile; three super-blocks in steps of two (the
# second step reads past the row: zero scales); one row a thread and four.
CASES = [(20, 512, (8, 2, 2)), (24, 768, (16, 2, 1)), (8, 256, (8, 1, 4)), (40, 1024, (32, 1, 1)),
         (20, 768, (8, 4, 4)),  # the default since round 35: one step, a super-block past K
         (20, 1024, (8, 1, 4, 3))]  # pipelined (the interpreter runs the loop as written; the launch takes it)


@needs_interpreter
@pytest.mark.parametrize("num_out,num_in,tiles", CASES)
def test_q4k_pairs_matches_the_dequantized_matmul(num_out, num_in, tiles):
    from octavo.kernels.quant import gguf_q4k_pairs

    generator = torch.Generator().manual_seed(num_in)
    raw = random_gguf_rows("Q4_K", num_out, num_in, generator)
    x = torch.randn(1, num_in, generator=generator).to(torch.bfloat16)
    expected = x.float() @ dequantize_gguf(raw, Q4_K).T
    out = gguf_q4k_pairs.q4k_gemv_pairs(x, raw, gguf_q4k_pairs.PairsTiles(*tiles))
    assert out.shape == (1, num_out) and out.dtype == torch.bfloat16
    # The output's rounding to bfloat16 (2**-9) and the activations' sums in pairs of bfloat16.
    assert relative_error(out, expected) < 6e-3
    # Every row is its own: a row's result does not depend on its neighbours (row 0 alone).
    alone = gguf_q4k_pairs.q4k_gemv_pairs(x, raw[:1].contiguous(), gguf_q4k_pairs.PairsTiles(*tiles))
    assert torch.equal(alone[0, 0], out[0, 0])


@needs_interpreter
def test_the_layer_op_takes_one_bfloat16_token_of_q4k_there(monkeypatch):
    from octavo.kernels.quant import gguf_q4k_pairs

    check_pairs_dispatch(gguf_q4k_pairs, gguf_q4k_pairs.q4k_gemv_pairs, "Q4_K", "Q6_K", "OCTAVO_GGUF_Q4K_PAIRS",
                         monkeypatch)


@triton.jit
def _decode_chunk_scales(header_ptr, out_ptr, NUM: tl.constexpr):
    """``_chunk_scales`` of ``NUM`` 16-byte headers: per header the eight scales, then the mins."""
    rows = tl.arange(0, NUM)[:, None]
    chunk = tl.arange(0, 4)[None, :]
    words = header_ptr.to(tl.pointer_type(tl.uint32)) + rows * 4
    s_lo, m_lo, s_hi, m_hi = _chunk_scales(words, tl.full((NUM, 1), 1, tl.int1), chunk)
    offsets = rows * 16 + chunk * 2
    tl.store(out_ptr + offsets, s_lo)
    tl.store(out_ptr + offsets + 1, s_hi)
    tl.store(out_ptr + 8 + offsets, m_lo)
    tl.store(out_ptr + 8 + offsets + 1, m_hi)


@needs_interpreter
def test_chunk_scales_decode_every_sub_block_as_ggml():
    # _chunk_scales decodes a chunk's two sub-blocks from one word's two bytes (shared with
    # gguf_q4k_dp4a): every chunk of random headers against the torch decoder, exactly.
    from octavo.kernels.quant.gguf_dequant import _scale_min_k4

    generator = torch.Generator().manual_seed(3)
    headers = torch.randint(0, 256, (16, 16), dtype=torch.uint8, generator=generator)
    headers[:, 0:4] = torch.tensor([1.0, 1.0], dtype=torch.float16).view(torch.uint8)  # d = dmin = 1
    out = torch.empty(16, 16, dtype=torch.float32)
    _decode_chunk_scales[(1,)](headers, out, NUM=16)
    scales, mins = _scale_min_k4(headers[:, 4:16])
    assert torch.equal(out[:, :8], scales) and torch.equal(out[:, 8:], mins)
