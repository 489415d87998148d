"""The one-token Q6_K GEMV in bfloat16 pairs (``gguf_q6k_pairs``) under Triton's
interpreter, which runs its plain-arithmetic twin (the PTX is compiled for sm_90
in ``test_triton_compile.py``): against the dequantized matmul, partial row
tiles, a step past the row's last super-block, super-blocks starting off a
word, and the layer op's dispatch to it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, dequantize_gguf, random_gguf_rows  # noqa: E402
from tests.quantization.helpers import check_pairs_dispatch, relative_error  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402

Q6_K = GGML_TYPES_BY_NAME["Q6_K"]


@not_interpreted
def test_q6k_pairs_under_interpreter():
    rerun_under_interpreter(__file__)


# (rows, inputs, tiles): a partial row tile; three super-blocks (odd ones start two bytes
# off a word) in steps of two, the second past the row (d = 0); one super-block a step;
# the default (four a step, most past K); pipelined (the interpreter runs the loop as written).
CASES = [(20, 768, (8, 2, 2)), (24, 512, (16, 1, 4)), (8, 256, (8, 4, 4)), (40, 1280, (8, 4, 4, 3))]


@needs_interpreter
@pytest.mark.parametrize("num_out,num_in,tiles", CASES)
def test_q6k_pairs_matches_the_dequantized_matmul(num_out, num_in, tiles):
    from octavo.kernels.quant import gguf_q6k_pairs

    generator = torch.Generator().manual_seed(num_in)
    raw = random_gguf_rows("Q6_K", num_out, num_in, generator)
    x = torch.randn(1, num_in, generator=generator).to(torch.bfloat16)
    expected = x.float() @ dequantize_gguf(raw, Q6_K).T
    out = gguf_q6k_pairs.q6k_gemv_pairs(x, raw, gguf_q6k_pairs.PairsTiles(*tiles))
    assert out.shape == (1, num_out) and out.dtype == torch.bfloat16
    # The output's rounding to bfloat16 (2**-9); the interpreter's twin multiplies in float32.
    assert relative_error(out, expected) < 6e-3
    # Every row is its own: a row's result does not depend on its neighbours (the last row alone).
    alone = gguf_q6k_pairs.q6k_gemv_pairs(x, raw[-1:].contiguous(), gguf_q6k_pairs.PairsTiles(*tiles))
    assert torch.equal(alone[0, 0], out[0, -1])


@needs_interpreter
def test_one_value_at_a_time():
    """Each of a super-block's 256 values reaches its own activation: one-hot activations
    read the dequantized row back, value by value (a misplaced nibble or high bit shows),
    to one bfloat16 rounding (``d (sc q)`` here, ``(d sc) q`` in the dequantizer)."""
    from octavo.kernels.quant import gguf_q6k_pairs

    raw = random_gguf_rows("Q6_K", 4, 512, torch.Generator().manual_seed(7))
    dense = dequantize_gguf(raw, Q6_K)
    for index in (0, 1, 2, 3, 4, 17, 31, 32, 63, 64, 95, 96, 127, 128, 160, 200, 255, 256, 300, 511):
        x = torch.zeros(1, 512, dtype=torch.bfloat16)
        x[0, index] = 1.0
        out = gguf_q6k_pairs.q6k_gemv_pairs(x, raw)
        torch.testing.assert_close(out.float()[0], dense[:, index], rtol=2**-7, atol=0)


@needs_interpreter
def test_the_layer_op_takes_one_bfloat16_token_of_q6k_there(monkeypatch):
    from octavo.kernels.quant import gguf_q6k_pairs

    raw = random_gguf_rows("Q6_K", 16, 512, torch.Generator().manual_seed(0))
    x = torch.randn(1, 512).to(torch.bfloat16)
    # Opt-in (no faster than the general GEMV on an H100, round 40).
    monkeypatch.delenv("OCTAVO_GGUF_Q6K_PAIRS", raising=False)
    gguf_q6k_pairs.pairs_enabled.cache_clear()
    assert not gguf_q6k_pairs.takes(x, raw, "Q6_K")
    monkeypatch.setenv("OCTAVO_GGUF_Q6K_PAIRS", "1")
    gguf_q6k_pairs.pairs_enabled.cache_clear()
    check_pairs_dispatch(gguf_q6k_pairs, gguf_q6k_pairs.q6k_gemv_pairs, "Q6_K", "Q4_K", "OCTAVO_GGUF_Q6K_PAIRS",
                         monkeypatch)
