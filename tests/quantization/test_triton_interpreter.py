"""The int4/int8 and GGUF Triton kernels, run on the CPU through Triton's
interpreter (in a subprocess, ``tests/quantization/interpreter.py``). Shapes
are small: the interpreter runs each program in Python. Known interpreter
limits (Triton 3.9), which compiled kernels do not have: bfloat16 ``tl.dot``
is wrong (the kernels multiply in float32 under the interpreter) and float32
-> bfloat16 casts truncate instead of rounding, so bfloat16 results get a
looser tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed")

from octavo.kernels.quant import int4, int4_mm_triton  # noqa: E402
from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, dequantize_gguf  # noqa: E402
from tests.quantization.interpreter import needs_interpreter, not_interpreted, rerun_under_interpreter  # noqa: E402
from tests.quantization.test_kernels import FUSED_TYPES, random_blocks  # noqa: E402


@not_interpreted
def test_kernels_under_interpreter():
    rerun_under_interpreter(__file__)


@pytest.fixture(scope="module")
def kernels():
    from octavo.kernels.quant import gguf_triton, int4_triton

    return int4_triton, gguf_triton


TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}

# (bits, out features, in features, group size, tokens, dtype): partial N and
# M tiles, several groups per 128-input block (32), one group over several
# blocks (128), two groups in one 256-input K step (512 / 128), 8-bit (also
# with groups smaller than its 64-input block), and inputs too few for
# 16-word blocks (64: P = 1).
GROUPED_CASES = [
    (4, 24, 256, 32, 1, torch.float32),
    (4, 40, 256, 64, 3, torch.bfloat16),
    (8, 24, 128, 64, 5, torch.float16),
    (4, 8, 64, 32, 2, torch.float32),
    (4, 16, 384, 128, 17, torch.float32),
    (4, 24, 512, 128, 9, torch.float32),
    (8, 16, 256, 32, 4, torch.float32),
]


# One K step of one and of two layout blocks (256 for 8-bit: four), split-K
# fixed and automatic (0), 384 inputs: block_k 256 shrinks to 128; W x^T.
MM_CONFIGS = [
    int4_mm_triton.GroupedMmConfig(16, 16),
    int4_mm_triton.GroupedMmConfig(16, 32, split_k=2, group_m=2, block_k=256),
    int4_mm_triton.GroupedMmConfig(32, 16, split_k=0, block_k=256, swap_ab=True),
]


def _close(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> bool:
    return bool((out.float() - expected.float()).abs().max() <= TOLERANCE[dtype] * expected.float().abs().max())


@pytest.mark.parametrize("bits,out_features,in_features,group_size,num_tokens,dtype", GROUPED_CASES)
@needs_interpreter
def test_grouped_kernels_match_reference(kernels, bits, out_features, in_features, group_size, num_tokens, dtype):
    from octavo.ops import quant_reference

    int4_triton, _ = kernels
    torch.manual_seed(0)
    weight = torch.randn(out_features, in_features).to(dtype)
    qweight, scales, zeros = int4.quantize_grouped_rtn(weight, group_size, bits)
    x, bias = torch.randn(num_tokens, in_features).to(dtype), torch.randn(out_features).to(dtype)
    reference = quant_reference.int4_linear if bits == 4 else quant_reference.int8_grouped_linear
    expected = reference(x, qweight, scales, zeros, group_size, bias)
    args = (x, qweight, scales, zeros, group_size, bias, bits)
    gemv_configs = (int4_triton.GroupedGemvConfig(block_n=4, blocks=2), int4_triton.GroupedGemvConfig(2, 4, deferred=True),
                    int4_triton.GroupedGemvConfig(16, 2, deferred=True, row_groups=2),  # second group partial or out
                    int4_triton.GroupedGemvConfig(4, 2, deferred=True, shared_inputs=True))
    for config in gemv_configs:
        gemv = int4_triton.grouped_gemv(*args, config=config)
        assert gemv.dtype == dtype and _close(gemv, expected, dtype), config
    if int4.plane_words(in_features, bits) == 16:
        for config in MM_CONFIGS:
            assert _close(int4_triton.grouped_mm(*args, config=config), expected, dtype), config
        strided = torch.cat([x, x], dim=1)[:, :in_features]  # rows 2 K apart: the kernel reads its own copy's stride
        assert _close(int4_triton.grouped_mm(strided, *args[1:], config=MM_CONFIGS[0]), expected, dtype)
    exact = int4.dequantize_grouped(qweight, scales, zeros, group_size, bits, torch.float32)
    for tile in (None, int4_triton.DequantTile(8, 128, 4), int4_triton.DequantTile(16, 2048, 8)):
        dense = int4_triton.grouped_dequantize(qweight, scales, zeros, group_size, bits, torch.float32, tile)
        assert torch.equal(dense, exact), tile
    assert _close(int4_triton.grouped_linear(*args), expected, dtype)


@needs_interpreter
def test_grouped_mm_splits_k_for_skinny_batches(kernels):
    int4_triton, _ = kernels
    cpu = torch.device("cpu")  # the interpreter's stand-in: 8 compute units
    assert int4_triton.mm_config(8, 4096, 4096, 4, cpu).split_k == 1  # 64 tiles already fill 8 units
    assert int4_triton.mm_config(8, 64, 4096, 4, cpu).split_k == 8  # 1 tile; each split keeps >= 4 of 32 blocks
    assert int4_triton.mm_config(512, 4096, 4096, 4, cpu).split_k == 1


@needs_interpreter
def test_grouped_mm_block_k_fits_the_inputs(kernels):
    int4_triton, _ = kernels
    cpu = torch.device("cpu")
    assert int4_triton.mm_config(512, 4096, 14336, 4, cpu).block_k == 128
    assert int4_mm_triton.fit_block_k(256, 384, 128) == 128  # 3 layout blocks
    assert int4_mm_triton.fit_block_k(512, 14336, 128) == 512
    with pytest.raises(ValueError, match="layout block"):
        int4_mm_triton.fit_block_k(64, 4096, 128)
    config = int4_mm_triton.GroupedMmConfig(16, 64, split_k=0, block_k=256)
    assert int4_mm_triton.auto_split(config, 8, 64, 4096, cpu) == 4  # 16 steps of 256: >= 4 per split


@needs_interpreter
def test_int4_mm_tiles_from_the_environment(kernels, monkeypatch):
    """``OCTAVO_INT4_MM_TILES``, ``OCTAVO_INT4_DEQUANT_TILE`` and
    ``OCTAVO_INT4_DEQUANT_MIN_TOKENS`` for tuning runs (read once per process)."""
    int4_triton, _ = kernels
    cached = (int4_mm_triton.mm_config_from_env, int4_mm_triton.dequant_tile_from_env, int4_triton.dequant_min_tokens)
    for function in cached:
        function.cache_clear()
    monkeypatch.setenv("OCTAVO_INT4_MM_TILES", "32,64,256,8,4")
    monkeypatch.setenv("OCTAVO_INT4_DEQUANT_TILE", "16,1024,8")
    monkeypatch.setenv("OCTAVO_INT4_DEQUANT_MIN_TOKENS", "4")
    try:
        config = int4_triton.mm_config(16, 64, 4096, 4, torch.device("cpu"))
        assert (config.block_m, config.block_n, config.block_k, config.num_warps, config.num_stages) == (32, 64, 256, 8, 4)
        assert config.split_k == 4  # not given: automatic
        assert int4_mm_triton.mm_env_value(config) == "32,64,256,8,4,4,0,0"
        assert int4_mm_triton.dequant_tile_from_env() == int4_triton.DequantTile(16, 1024, 8)
        assert int4_triton.dequant_min_tokens() == 4
        torch.manual_seed(0)
        qweight, scales, zeros = int4.quantize_grouped_rtn(torch.randn(24, 256), 128, 4)
        x = torch.randn(3, 256)
        from octavo.ops import quant_reference

        expected = quant_reference.int4_linear(x, qweight, scales, zeros, 128, None)
        assert _close(int4_triton.int4_linear(x, qweight, scales, zeros, 128, None), expected, torch.float32)
        for function in cached:
            function.cache_clear()
        monkeypatch.setenv("OCTAVO_INT4_MM_TILES", "16,64,128,4,3,2,1")
        assert int4_mm_triton.mm_config_from_env() == int4_mm_triton.GroupedMmConfig(16, 64, 2, 8, 4, 3, 128, True)
        int4_mm_triton.mm_config_from_env.cache_clear()
        monkeypatch.setenv("OCTAVO_INT4_MM_TILES", "32,64,256")
        with pytest.raises(ValueError, match="block_m,block_n,block_k"):
            int4_mm_triton.mm_config_from_env()
    finally:
        for function in cached:
            function.cache_clear()


def _gguf_rows(type_name: str, rows: int, seed: int) -> tuple[torch.Tensor, int]:
    """Random rows of ``type_name``: 512 inputs, or 352 for 32-value types
    (eleven blocks: a partial last 256-value step)."""
    t = GGML_TYPES_BY_NAME[type_name]
    num_in = 512 if t.block_elems == 256 else 352
    blocks = random_blocks(type_name, rows * num_in // t.block_elems, np.random.default_rng(seed))
    return torch.from_numpy(blocks.reshape(rows, -1)), num_in


@needs_interpreter
@pytest.mark.parametrize("type_name", FUSED_TYPES)
def test_gguf_triton_dequant_bit_exact(kernels, type_name):
    _, gguf_triton = kernels
    raw, _ = _gguf_rows(type_name, 20, 5)
    t = GGML_TYPES_BY_NAME[type_name]
    assert torch.equal(gguf_triton.gguf_dequantize(raw, t, torch.float32), dequantize_gguf(raw, t))


@needs_interpreter
@pytest.mark.parametrize("type_name", FUSED_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_triton_matmuls(kernels, type_name, dtype):
    """The GEMV (3 tokens; 1 token: the one-token kernel where K holds whole
    steps, 512 inputs for the K-quants, the general one at 352) and the
    tensor-core kernel (19 tokens: a partial M tile) against the torch
    dequantizer + matmul; 20 rows: a partial N tile."""
    _, gguf_triton = kernels
    raw, num_in = _gguf_rows(type_name, 20, 6)
    t = GGML_TYPES_BY_NAME[type_name]
    dense = dequantize_gguf(raw, t)
    for num_tokens, run in (
        (3, lambda x: gguf_triton.gguf_gemv(x, raw, t, gguf_triton.GGUFGemvConfig(block_n=8, steps=2))),
        (1, lambda x: gguf_triton.gguf_gemv(x, raw, t, gguf_triton.GGUFGemvConfig(block_n=8, steps=2))),
        (1, lambda x: gguf_triton.gguf_gemv(x, raw, t, gguf_triton.GGUFGemvConfig(block_n=4, steps=1, num_warps=1))),
        (19, lambda x: gguf_triton.gguf_mm(x, raw, t, gguf_triton.GGUFMmConfig(block_m=16, block_n=16))),
    ):
        x = torch.randn(num_tokens, num_in).to(dtype)
        out, expected = run(x), x.float() @ dense.t()
        assert out.dtype == dtype and _close(out, expected, dtype), num_tokens


@needs_interpreter
def test_int4_gemv_tiles_from_the_environment(kernels, monkeypatch):
    """``OCTAVO_INT4_GEMV_TILES`` sets the GEMV's tiles for tuning runs (read once per process)."""
    int4_triton, _ = kernels
    int4_triton.gemv_config_from_env.cache_clear()
    monkeypatch.setenv("OCTAVO_INT4_GEMV_TILES", "8,16,4,1")
    try:
        assert int4_triton.gemv_config_from_env() == int4_triton.GroupedGemvConfig(8, 16, 4, deferred=True)
        int4_triton.gemv_config_from_env.cache_clear()
        monkeypatch.setenv("OCTAVO_INT4_GEMV_TILES", "8,16,4,1,2")
        assert int4_triton.gemv_config_from_env() == int4_triton.GroupedGemvConfig(8, 16, 4, True, row_groups=2)
        int4_triton.gemv_config_from_env.cache_clear()
        monkeypatch.setenv("OCTAVO_INT4_GEMV_TILES", "4,8,4,1,1,1")
        assert int4_triton.gemv_config_from_env() == int4_triton.GroupedGemvConfig(4, 8, 4, True, shared_inputs=True)
        int4_triton.gemv_config_from_env.cache_clear()
        monkeypatch.setenv("OCTAVO_INT4_GEMV_TILES", "8,16")
        with pytest.raises(ValueError, match="block_n,blocks,num_warps"):
            int4_triton.gemv_config_from_env()
    finally:
        int4_triton.gemv_config_from_env.cache_clear()


@needs_interpreter
def test_gguf_gemv_tiles_from_the_environment(kernels, monkeypatch):
    """``OCTAVO_GGUF_GEMV_TILES_<TYPE>`` before ``OCTAVO_GGUF_GEMV_TILES``; the GEMV runs with them."""
    _, gguf_triton = kernels
    gguf_triton.gemv_config_from_env.cache_clear()
    monkeypatch.setenv("OCTAVO_GGUF_GEMV_TILES", "2,1,4")
    monkeypatch.setenv("OCTAVO_GGUF_GEMV_TILES_Q4_K", "8,4,8")
    try:
        assert gguf_triton.gemv_config_from_env("Q4_K") == gguf_triton.GGUFGemvConfig(8, 4, 8)
        assert gguf_triton.gemv_config_from_env("Q6_K") == gguf_triton.GGUFGemvConfig(2, 1, 4)
        t = GGML_TYPES_BY_NAME["Q6_K"]
        raw, num_in = _gguf_rows("Q6_K", 6, seed=3)
        x = torch.randn(1, num_in)
        expected = x @ dequantize_gguf(raw, t, torch.float32).T
        assert _close(gguf_triton.gguf_gemv(x, raw, t), expected, torch.float32)
    finally:
        gguf_triton.gemv_config_from_env.cache_clear()


# (out features, in features, group size, dtype): a partial 64-row tile, one
# group per block, a group over two blocks, zero points up to 16 (legacy GPTQ).
# bfloat16 runs both forms: values in bfloat16 pairs (packed) and one at a time.
ROWS_CASES = [(100, 384, 128, torch.float32, 1), (64, 512, 256, torch.bfloat16, 1), (40, 256, 128, torch.bfloat16, 0),
              (8, 128, 128, torch.float16, 1)]


@pytest.mark.parametrize("out_features,in_features,group_size,dtype,packed", ROWS_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
# The default: one step, most blocks past K; prefetching: the next step's weights before this
# step's sums, with one block a step (every step a loop turn) and two (the last one partial).
# Pipelined (stages 3: the interpreter runs the loop as written, the launch takes the field).
@pytest.mark.parametrize("tiles", [(8, 2, 2, 0, 1), (8, 16, 8, 0, 1), (8, 1, 2, 1, 1), (8, 2, 2, 1, 1), (8, 1, 2, 0, 3)],
                         ids=["8-2-2", "default", "8-1-2-prefetch", "8-2-2-prefetch", "8-1-2-stages3"])
@needs_interpreter
def test_int4_gemv_rows_matches_reference(kernels, out_features, in_features, group_size, dtype, packed, with_bias,
                                          tiles, monkeypatch):
    from octavo.kernels.quant import int4_gemv_rows

    block_n, split, num_warps, prefetch, stages = tiles
    monkeypatch.setattr(int4_gemv_rows, "TILES",
                        int4_gemv_rows.RowsTiles(block_n, split, num_warps, packed, prefetch, stages))
    from octavo.ops import quant_reference

    int4_triton, _ = kernels
    torch.manual_seed(1)
    qweight, scales, zeros = int4.quantize_grouped_rtn(torch.randn(out_features, in_features).to(dtype), group_size, 4)
    zeros[0, 0], zeros[-1, -1] = 16, 0
    x = torch.randn(1, in_features).to(dtype)
    bias = torch.randn(out_features).to(dtype) if with_bias else None
    expected = quant_reference.int4_linear(x, qweight, scales, zeros, group_size, bias)
    assert int4_gemv_rows.takes(1, in_features, group_size, 4)
    out = int4_gemv_rows.int4_gemv_rows(x, qweight, scales, zeros, group_size, bias)
    assert out.dtype == dtype and _close(out, expected, dtype)
    # The op's one-token dispatch goes there; two tokens, groups of 64 or 8 bits do not.
    assert torch.equal(int4_triton.grouped_linear(x, qweight, scales, zeros, group_size, bias, 4), out)
    assert not int4_gemv_rows.takes(2, in_features, group_size, 4)
    assert not int4_gemv_rows.takes(1, in_features, 64, 4) and not int4_gemv_rows.takes(1, in_features, 128, 8)
