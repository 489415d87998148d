"""The quantized GEMM paths the GPU benchmarks time, per weight format
("family"), at Llama-3.1-8B shapes: Octavo's kernels (each path of their
dispatch, and the dispatch itself, "op") and the built-in alternatives
torch offers for the same format.

* ``bf16``: cuBLAS (``F.linear``), Octavo's GEMV.
* ``fp8`` (per-channel e4m3): the weight-only GEMV; Triton per-token
  quantization + ``torch._scaled_mm`` (row-wise); the old plain-torch
  quantization + ``_scaled_mm``.
* ``fp8_block`` (128 x 128 blocks): the block GEMV; per-group quantization
  + the block-scaled Triton GEMM; ``torch.nn.functional.scaled_mm`` with
  block-wise recipes where this torch has it.
* ``int4`` (groups of 128, Octavo's layout = GPTQ's after load): the GEMV,
  the tensor-core kernel, dequantize + cuBLAS; ``torch._weight_int4pack_mm``
  (tinygemm) on its own packing.
* ``gguf_Q4_K`` / ``gguf_Q6_K`` / ``gguf_Q8_0``: the GEMV, the tile GEMM,
  dequantize + cuBLAS.
* other libraries' kernels on the same weights (``quant_libraries.py``:
  fbgemm-gpu-genai, gemlite), where they are installed.

A path is ``make(weights, config) -> fn(x)``; ``None`` from ``available``
means it runs here, else the reason it does not (printed once). Module
constants (``DEVICE``, ``SHAPES``) are patched by the CPU smoke tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from octavo.kernels import gemv as gemv_kernels
from octavo.kernels.quant import (
    fp8_block_triton, fp8_gemv_rows, fp8_triton, gguf_q4k_dp4a, gguf_q4k_pairs, gguf_q6k_pairs, gguf_triton, int4, int4_gemv_dp4a, int4_gemv_rows,
    int4_mm_triton, int4_triton, scaled_mm, skinny_8bit,
)
from octavo.kernels.quant.gguf_dequant import GGML_TYPES_BY_NAME, dequantize_gguf, random_gguf_rows

DEVICE = torch.device("cuda")
DTYPE = torch.bfloat16
# (name, K inputs, N outputs): one Llama-3.1-8B decoder layer.
SHAPES = [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096)]
BLOCK = 128  # fp8 block size and int4 group size
FAMILIES = ("bf16", "fp8", "fp8_block", "int4", "gguf_Q4_K", "gguf_Q6_K", "gguf_Q8_0")


@dataclass(frozen=True)
class Path:
    family: str
    name: str
    make: Callable  # (weights, config) -> fn(x)
    max_tokens: int | None = None  # kernels that only take a few rows

    @property
    def label(self) -> str:
        return f"{self.family} {self.name}"


def make_weights(family: str, num_out: int, num_in: int, generator: torch.Generator) -> tuple:
    """The family's weight tensors for one [N, K] layer, on DEVICE."""
    dense = (torch.randn(num_out, num_in, generator=generator) * 0.02).to(DEVICE, DTYPE)
    if family == "bf16":
        return (dense,)
    if family == "fp8":
        return scaled_mm.quantize_fp8_per_channel(dense)
    if family == "fp8_block":
        return scaled_mm.quantize_fp8_block(dense, BLOCK, BLOCK)
    if family == "int4":
        return int4.quantize_int4_rtn(dense, BLOCK)
    type_name = family.removeprefix("gguf_")
    return (random_gguf_rows(type_name, num_out, num_in, generator).to(DEVICE),)


def weight_bytes(weights: tuple) -> int:
    return sum(t.numel() * t.element_size() for t in weights)


def _gguf_type(family: str):
    return GGML_TYPES_BY_NAME[family.removeprefix("gguf_")]


def _torch_int4pack(weights, config):
    """tinygemm: uint8 [N, K/2] (even input in the high nibble) -> its tile
    layout; scales_and_zeros [G, N, 2] with W = (q - 8) * scale + zero."""
    qweight, scales, zeros = weights
    values = int4.unpack_grouped(qweight, 4).to(torch.int32)
    packed = torch._convert_weight_to_int4pack((values[:, ::2] << 4 | values[:, 1::2]).to(torch.uint8), 8)
    shift = ((8 - zeros.to(torch.float32)) * scales.to(torch.float32)).to(scales.dtype)
    scales_and_zeros = torch.stack([scales.t(), shift.t()], dim=-1).contiguous()
    return lambda x: torch._weight_int4pack_mm(x, packed, BLOCK, scales_and_zeros)


def _pairs_tiles(num_tokens: int) -> int4_mm_triton.GroupedMmConfig:
    """The pairs tile's tiles: 128 rows and 256-input steps on mma.sync (sm_90 loop: 2.98
    instructions a value) up to 16 tokens, split-K automatic; the default tiles above."""
    if num_tokens <= 16:
        return int4_mm_triton.GroupedMmConfig(16, 128, 0, 8, 4, 3, 256, pairs=True)
    return dataclasses.replace(int4_mm_triton._default_tiles(num_tokens), pairs=True)


def _skinny_w8a8(weights, config):
    """The tensor-core skinny kernel on fp8 activations, their quantization launch included."""
    def run(x):
        xq, x_scale = fp8_triton.quantize_fp8_rows(x)
        return skinny_8bit.skinny_8bit_linear(xq, *weights, None, x_scale.view(-1), x.dtype, config)

    return run


def _torch_blockwise(weights, config):
    from torch.nn.functional import ScalingType

    qweight, scale = weights

    def run(x):
        xq, x_scale = fp8_triton.quantize_fp8_rows(x, group_size=BLOCK)
        return F.scaled_mm(
            xq, qweight.t(), x_scale, ScalingType.BlockWise1x128, scale, ScalingType.BlockWise128x128,
            output_dtype=torch.bfloat16,
        )

    return run


# The one-token GEMVs in bfloat16 pairs, by ggml type (the types that have one).
PAIRS_GEMVS = {"Q4_K": gguf_q4k_pairs.q4k_gemv_pairs, "Q6_K": gguf_q6k_pairs.q6k_gemv_pairs}


def _gguf_paths(family: str) -> list[Path]:
    t = _gguf_type(family)
    pairs = PAIRS_GEMVS.get(t.name)
    return [
        Path(family, "gemv", lambda w, c: lambda x: gguf_triton.gguf_gemv(
            x, w[0], t, c or gguf_triton.GEMV_CONFIG_BY_TYPE.get(t.name, gguf_triton.GEMV_CONFIG)), 8),
        Path(family, "tile_mm", lambda w, c: lambda x: gguf_triton.gguf_mm(x, w[0], t, c or gguf_triton.MM_CONFIG)),
        Path(family, "dequant+cublas", lambda w, c: lambda x: F.linear(x, gguf_triton.gguf_dequantize(w[0], t, x.dtype))),
        Path(family, "torch_dequant+cublas", lambda w, c: lambda x: F.linear(x, dequantize_gguf(w[0], t, x.dtype))),
        Path(family, "op", lambda w, c: lambda x: gguf_triton.gguf_linear(x, w[0], t)),
    ] + ([Path(family, "gemv_pairs", lambda w, c: lambda x: pairs(x, w[0], c), 1)] if pairs else []) + (
        # W4A8: the activations' int8 launch and the dp4a GEMV, timed together.
        [Path(family, "gemv_dp4a", lambda w, c: lambda x: gguf_q4k_dp4a.q4k_gemv_dp4a(x, w[0], c), 1)]
        if t.name == "Q4_K" else [])


def all_paths() -> list[Path]:
    gv = gemv_kernels
    paths = [
        Path("bf16", "cublas", lambda w, c: lambda x: F.linear(x, w[0])),
        Path("bf16", "gemv", lambda w, c: lambda x: gv.gemv(x, w[0], None, config=c), 8),
        # The default fitted to the rows, as scaled_linear_gemv does (round 35's table ran the one-row
        # default at 4 tokens: 32k deferred products a program, 6.2 ms a layer, a path no call takes).
        Path("fp8", "gemv", lambda w, c: lambda x: gv.gemv(
            x, w[0], None, config=c or gv.fit_to_rows(gv.DEFAULT_8BIT_CONFIG, x.shape[0]), weight_scale=w[1]), 8),
        Path("fp8", "gemv_rows", lambda w, c: lambda x: fp8_gemv_rows.fp8_gemv_rows(x, *w, None, c), 1),
        Path("fp8", "triton_quant+scaled_mm", lambda w, c: lambda x: fp8_triton.fp8_w8a8_linear(x, *w, None)),
        Path("fp8", "skinny", lambda w, c: lambda x: skinny_8bit.skinny_8bit_linear(x, *w, None, config=c), 16),
        Path("fp8", "skinny_w8a8", _skinny_w8a8, 16),
        Path("fp8", "torch_quant+scaled_mm", lambda w, c: lambda x: scaled_mm.fp8_w8a8_linear(x, *w)),
        Path("fp8_block", "gemv", lambda w, c: lambda x: fp8_block_triton.block_gemv(
            x, *w, BLOCK, BLOCK, None, c or fp8_block_triton.DEFAULT_GEMV), 8),
        Path("fp8_block", "block_mm", lambda w, c: lambda x: fp8_block_triton.block_scaled_mm(
            x, *w, BLOCK, BLOCK, None, c or fp8_block_triton.DEFAULT_MM)),
        Path("fp8_block", "op", lambda w, c: lambda x: fp8_block_triton.fp8_block_linear(x, *w, BLOCK, BLOCK, None)),
        Path("fp8_block", "torch_blockwise_scaled_mm", _torch_blockwise),
        Path("int4", "gemv", lambda w, c: lambda x: int4_triton.grouped_gemv(
            x, *w, BLOCK, None, 4, c or int4_triton.GEMV_CONFIG), 8),
        Path("int4", "gemv_rows", lambda w, c: lambda x: int4_gemv_rows.int4_gemv_rows(x, *w, BLOCK, None, c), 1),
        # W4A8: the activations' int8 launch and the dp4a GEMV, timed together.
        Path("int4", "gemv_dp4a", lambda w, c: lambda x: int4_gemv_dp4a.int4_gemv_dp4a(x, *w, BLOCK, None, c), 1),
        Path("int4", "tc_mm", lambda w, c: lambda x: int4_triton.grouped_mm(x, *w, BLOCK, None, 4, c)),
        # The weight tile in bfloat16 pairs (int4_pairs_tile): wide tiles at up to 16 tokens, else the defaults.
        Path("int4", "tc_mm_pairs", lambda w, c: lambda x: int4_triton.grouped_mm(
            x, *w, BLOCK, None, 4, c or _pairs_tiles(x.shape[0]))),
        Path("int4", "dequant+cublas", lambda w, c: lambda x: F.linear(
            x, int4_triton.grouped_dequantize(*w, BLOCK, 4, x.dtype, c))),
        Path("int4", "op", lambda w, c: lambda x: int4_triton.int4_linear(x, *w, BLOCK, None)),
        Path("int4", "torch_int4pack_mm", _torch_int4pack),
    ]
    for family in FAMILIES:
        if family.startswith("gguf_"):
            paths += _gguf_paths(family)
    from quant_libraries import LIBRARY_PATHS  # other libraries' kernels on the same weights

    return paths + [Path(family, name, make) for family, name, make in LIBRARY_PATHS]


def reference(family: str, weights: tuple, x: torch.Tensor) -> torch.Tensor:
    """float32 ``x @ W.T`` with the family's dequantized weight."""
    if family == "bf16":
        dense = weights[0].float()
    elif family == "fp8":
        dense = weights[0].float() * weights[1][:, None]
    elif family == "fp8_block":
        dense = scaled_mm.dequantize_fp8_block(*weights, BLOCK, BLOCK, torch.float32)
    elif family == "int4":
        dense = int4.dequantize_int4(*weights, BLOCK, torch.float32)
    else:
        dense = dequantize_gguf(weights[0], _gguf_type(family))
    return x.float() @ dense.t()


def fp8_op_path(num_tokens: int) -> str:
    """The path the registered ``fp8_linear`` chain takes on a GPU at ``num_tokens``."""
    from octavo.kernels.builtin import quant_gemv_max_tokens

    return "gemv" if num_tokens <= quant_gemv_max_tokens() else "triton_quant+scaled_mm"


_WORKER_WEIGHTS: dict = {}


def path_by_label(family: str, name: str) -> Path:
    return next(p for p in all_paths() if p.family == family and p.name == name)


def compile_job(job: tuple) -> str | None:
    """Worker process (``kernels_gpu_sweep.compile_in_pool``): run one path
    with one config at one token count on every shape, so that its kernels
    land in Triton's disk cache; the error text if it cannot run."""
    family, name, num_tokens, config = job
    path = path_by_label(family, name)
    generator = torch.Generator().manual_seed(0)
    try:
        for shape, num_in, num_out in SHAPES:
            key = (family, shape)
            if key not in _WORKER_WEIGHTS:
                _WORKER_WEIGHTS.clear() if len(_WORKER_WEIGHTS) > 8 else None
                _WORKER_WEIGHTS[key] = make_weights(family, num_out, num_in, generator)
            x = torch.randn(num_tokens, num_in, device=DEVICE, dtype=DTYPE)
            path.make(_WORKER_WEIGHTS[key], config)(x)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 -- reported, the timing process retries
        return f"{family} {name} M={num_tokens}: {type(exc).__name__}: {str(exc)[:100]}"
    return None
