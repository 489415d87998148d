"""Quantization kernels against their references, on the CPU.

* int4 packing (GPTQ rows, AWQ interleaved columns) against the numpy
  packers of ``packers.py``; round-to-nearest int4 within its error bound;
* GGUF torch dequantization bit-exact against the ``gguf`` package's numpy
  dequantizer, for every supported type;
* fp8 / int8 quantizers within their bounds; the W8A8 matmuls
  (``torch._scaled_mm`` and ``torch._int_mm`` both run on the CPU) against
  the float32 product of the same quantized operands.

The Triton kernels run through Triton's interpreter in ``test_triton_interpreter.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.kernels.quant import int4, scaled_mm
from octavo.kernels.quant.gguf_dequant import GGML_TYPES, GGML_TYPES_BY_NAME, SCALE_OFFSETS, dequantize_gguf
from tests.quantization import packers
from tests.quantization.gguf_writer import quantize

QUANT_TYPES = [t.name for t in GGML_TYPES.values() if t.is_quantized]
# The types with fused Triton kernels (the others dequantize in torch on a GPU).
FUSED_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]


def random_blocks(type_name: str, num_blocks: int, rng) -> np.ndarray:
    """Random bytes with sane float16 scale fields (no NaN/inf)."""
    t = GGML_TYPES_BY_NAME[type_name]
    blocks = rng.integers(0, 256, size=(num_blocks, t.block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[type_name]:
        blocks[:, offset : offset + 2] = rng.uniform(-0.1, 0.1, (num_blocks, 1)).astype(np.float16).view(np.uint8)
    return blocks


def test_int4_row_packing_matches_spec_packer():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 16, size=(64, 24))
    expected = packers._pack_nibbles(values, axis=0)
    packed = int4.pack_int4_rows(torch.from_numpy(values))
    assert np.array_equal(packed.numpy(), expected)
    assert torch.equal(int4.unpack_int4_rows(packed), torch.from_numpy(values).to(torch.uint8))


def test_awq_column_packing_matches_spec_packer():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 16, size=(5, 32))
    expected = packers._pack_nibbles(values, axis=1, order=packers.AWQ_ORDER)
    packed = int4.pack_int4_cols(torch.from_numpy(values), int4.AWQ_ORDER)
    assert np.array_equal(packed.numpy(), expected)
    assert torch.equal(int4.unpack_int4_cols(packed, int4.AWQ_ORDER), torch.from_numpy(values).to(torch.uint8))
    # Nibble 1 of a word holds column 2 of its group of eight.
    one_hot = np.zeros((1, 8), dtype=np.int64)
    one_hot[0, 2] = 5
    assert int(int4.pack_int4_cols(torch.from_numpy(one_hot), int4.AWQ_ORDER)[0, 0]) == 5 << 4


@pytest.mark.parametrize("group_size,bits", [(32, 4), (64, 4), (128, 4), (64, 8)])
def test_rtn_grouped_within_bound(group_size, bits):
    weight = torch.randn(48, 256) * 0.1
    qweight, scales, zeros = int4.quantize_grouped_rtn(weight, group_size, bits)
    assert qweight.shape == (48, 256 * bits // 32) and scales.shape == (48, 256 // group_size)
    assert zeros.dtype == int4.zeros_dtype(bits)
    dense = int4.dequantize_grouped(qweight, scales, zeros, group_size, bits, torch.float32)
    step = scales.repeat_interleave(group_size, dim=1)
    assert bool(((dense - weight).abs() <= step * 1.0001).all())


@pytest.mark.parametrize("num_in,bits", [(256, 4), (384, 4), (64, 4), (128, 8), (40, 8)])
def test_grouped_layout_planes(num_in, bits):
    """Word ``i`` of a block holds inputs ``i + P * j`` in bit field ``j``
    (``P`` = 16 words when the inputs fill whole blocks, else 1)."""
    pack = 32 // bits
    values = torch.randint(0, 1 << bits, (3, num_in))
    packed = int4.pack_grouped(values, bits)
    assert torch.equal(int4.unpack_grouped(packed, bits).long(), values)
    planes = int4.plane_words(num_in, bits)
    assert planes == (16 if num_in % (16 * pack) == 0 else 1)
    word, field = 5 % planes, 3  # input (block 0) i + P * j
    one_hot = torch.zeros(1, num_in, dtype=torch.long)
    one_hot[0, word + planes * field] = 1
    assert int(int4.pack_grouped(one_hot, bits)[0, word]) == 1 << (bits * field)


def test_gptq_8bit_row_packing():
    values = torch.randint(0, 256, (16, 6))
    packed = int4.pack_int4_rows(values, bits=8)
    assert packed.shape == (4, 6) and int(packed[0, 0]) & 0xFF == int(values[0, 0])
    assert torch.equal(int4.unpack_int4_rows(packed, bits=8).long(), values)


@pytest.mark.parametrize("type_name", [t.name for t in GGML_TYPES.values() if t.is_quantized])
def test_gguf_dequant_bit_exact_vs_gguf_package(type_name):
    import gguf

    rng = np.random.default_rng(2)
    t = GGML_TYPES_BY_NAME[type_name]
    raw = random_blocks(type_name, 48, rng).reshape(3, -1)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    out = dequantize_gguf(torch.from_numpy(raw), t)
    assert out.shape == expected.shape
    assert np.array_equal(out.numpy(), expected)


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16"])
def test_gguf_plain_types(type_name):
    import gguf

    values = np.random.default_rng(3).normal(size=(4, 64)).astype(np.float32)
    raw = np.ascontiguousarray(quantize(values, type_name)).view(np.uint8)
    expected = gguf.quants.dequantize(quantize(values, type_name), gguf.GGMLQuantizationType[type_name])
    out = dequantize_gguf(torch.from_numpy(raw), GGML_TYPES_BY_NAME[type_name])
    assert np.array_equal(out.numpy(), np.asarray(expected, dtype=np.float32))


PACKER_BITS = {
    "Q8_0": 8, "Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q2_K": 2, "Q3_K": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6,
    "IQ4_NL": 4, "IQ4_XS": 4,
}


@pytest.mark.parametrize("type_name", list(PACKER_BITS))
def test_test_packers_are_within_format_bounds(type_name):
    """The tests' own quantizers (gguf.quants and the K-quant packers) give
    values close to the input: they are what the GGUF tests load."""
    import gguf

    values = np.random.default_rng(4).normal(0, 0.08, size=(8, 512)).astype(np.float32)
    dq = gguf.quants.dequantize(quantize(values, type_name), gguf.GGMLQuantizationType[type_name])
    bits = PACKER_BITS[type_name]
    # Half a step of a (2**bits - 1)-level grid over the block's range, plus
    # the 6/8-bit rounding of the sub-block scales.
    bound = 1.5 * (values.max() - values.min()) / (2**bits - 1)
    assert np.abs(dq - values).max() <= bound


def test_fp8_and_int8_quantizers_within_bounds():
    weight = torch.randn(64, 96) * 0.05
    q, scale = scaled_mm.quantize_fp8_per_channel(weight)
    error = (q.float() * scale[:, None] - weight).abs()
    assert bool((error <= 2**-4 * weight.abs() + 2**-10 * scale[:, None]).all())
    q, scale = scaled_mm.quantize_int8_per_channel(weight)
    assert q.dtype == torch.int8
    assert bool(((q.float() * scale[:, None] - weight).abs() <= scale[:, None] / 2 + 1e-9).all())


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_w8a8_matmul_matches_reference(kind):
    """The CPU runs both torch._scaled_mm and torch._int_mm: check the W8A8
    paths (as the GPU runs them) against the float32 product."""
    x, weight = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(48, 64)
    if kind == "fp8":
        qweight, scale = scaled_mm.quantize_fp8_per_channel(weight)
        xq, x_scale = scaled_mm.quantize_fp8_per_token(x)
        out = scaled_mm.fp8_w8a8_linear(x, qweight, scale)
    else:
        qweight, scale = scaled_mm.quantize_int8_per_channel(weight)
        xq, x_scale = scaled_mm.quantize_int8_per_token(x)
        out = scaled_mm.int8_w8a8_linear(x, qweight, scale)
    expected = scaled_mm.w8a8_reference(xq, x_scale, qweight, scale)
    assert out.dtype == torch.bfloat16 and out.shape == (5, 48)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)
    dense = x.float() @ weight.t()
    assert (out.float() - dense).norm() <= 0.06 * dense.norm()


def test_weight_only_equals_dequantized_matmul():
    x, weight = torch.randn(3, 64), torch.randn(40, 64)
    qweight, scale = scaled_mm.quantize_int8_per_channel(weight)
    expected = x @ (qweight.float() * scale[:, None]).t()
    torch.testing.assert_close(scaled_mm.weight_only_linear(x, qweight, scale), expected, rtol=1e-5, atol=1e-5)


def test_cpu_probes():
    """On the CPU: int8 W8A8 through torch._int_mm, fp8 weight-only."""
    assert scaled_mm.int8_w8a8_supported(torch.device("cpu"))
    assert not scaled_mm.fp8_w8a8_supported(torch.device("cpu"))
