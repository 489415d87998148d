"""fp8 (e4m3) activations on the GPU: dynamic quantization in one launch.

``quantize_fp8_rows`` scales each row of ``x [M, K]`` (per token) or each
``group_size`` run of a row (per token-group, for block-scaled weights) by
``amax / 448`` and rounds to float8_e4m3fn, in one Triton launch: one
program per (row, group) reads its values twice (amax, then quantize; the
second read hits the cache) and writes the fp8 values and a float32 scale.
The plain-torch version (``scaled_mm.quantize_fp8_per_token``) took four
launches per call (amax, divide, clamp, cast), which at decode cost more
than the matmul it fed.

Rows can be padded (``pad_rows_to``) for GEMMs that want a multiple of 16
rows: padding rows come out as zeros with the smallest scale, so they add
nothing and stay finite. ``fp8_w8a8_linear`` is the ``fp8_linear`` layer op
for batches past the weight-only GEMV: this quantization, then
``torch._scaled_mm`` with row-wise scales (float32 accumulation, cuBLASLt).

Same formula as the torch reference (``scale = max(amax / 448, 1e-12)``,
``q = clamp(x / scale)`` with IEEE division), so both round alike.
"""

from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from octavo.kernels.fp8_cast import cast_to, pre_round
from octavo.kernels.quant import scaled_mm
from octavo.kernels.quant.skinny_8bit import w8a8_matmul
from octavo.kernels.triton_utils import cdiv, next_power_of_2

logger = logging.getLogger(__name__)

# Values per load step: rows up to this many values are read in one step.
MAX_BLOCK = 2048


# M changes every step: not specialised on (a recompile mid-serving stalls).
@triton.jit(do_not_specialize=["M"])
def _quantize_rows_kernel(
    x_ptr, q_ptr, scale_ptr, M, K, group_size, num_groups, stride_xm, stride_qm,
    BLOCK: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr, PRE_ROUND: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.program_id(1)
    start = group * group_size
    end = tl.minimum(start + group_size, K)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    q_row = q_ptr + row.to(tl.int64) * stride_qm
    # Padding rows read nothing: zeros with the smallest scale.
    read_end = tl.where(row < M, end, start)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(start, end, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < read_end, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, 0) / QMAX, MIN_SCALE)
    for k0 in range(start, end, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < read_end, other=0.0).to(tl.float32)
        q = tl.clamp(tl.math.div_rn(x, scale), -QMAX, QMAX)
        tl.store(q_row + offs, cast_to(q, q_ptr.dtype.element_ty, PRE_ROUND), mask=offs < end)
    tl.store(scale_ptr + row.to(tl.int64) * num_groups + group, scale)


def quantize_fp8_rows(
    x: torch.Tensor, group_size: int | None = None, pad_rows_to: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (float8_e4m3fn ``[M', K]``, float32 scales ``[M', K / group_size]``).

    ``group_size`` None: one scale per row (``[M', 1]``). ``M'`` is ``M``
    rounded up to ``pad_rows_to``; the padding rows are zeros.
    """
    num_tokens, num_in = x.shape
    group = num_in if group_size is None else group_size
    if num_in % group:
        raise ValueError(f"{num_in} features are not a whole number of groups of {group}")
    if x.stride(1) != 1:
        x = x.contiguous()
    rows = cdiv(max(num_tokens, 1), pad_rows_to) * pad_rows_to
    num_groups = num_in // group
    q = torch.empty(rows, num_in, dtype=scaled_mm.FP8_DTYPE, device=x.device)
    scales = torch.empty(rows, num_groups, dtype=torch.float32, device=x.device)
    _quantize_rows_kernel[(rows, num_groups)](
        x, q, scales, num_tokens, num_in, group, num_groups, x.stride(0), q.stride(0),
        BLOCK=min(MAX_BLOCK, next_power_of_2(group)), QMAX=scaled_mm.FP8_MAX, MIN_SCALE=scaled_mm.MIN_SCALE,
        PRE_ROUND=pre_round(), num_warps=4,
    )
    return q, scales


def _quantize_padded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_fp8_rows(x, pad_rows_to=scaled_mm.SCALED_MM_ROW_MULTIPLE)


def fp8_w8a8_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The ``fp8_linear`` layer op on the GPU past the GEMV's batches: one
    quantization launch, then ``torch._scaled_mm`` (row-wise scales)."""
    return scaled_mm.fp8_w8a8_linear(x, qweight, weight_scale, bias, quantize=_quantize_padded, matmul=w8a8_matmul)


@functools.cache
def fp8_kernels_supported(device: torch.device) -> bool:
    """Whether Triton reads and multiplies fp8 e4m3 on ``device`` (NVIDIA
    compute capability >= 8.9): a one-off probe of the GEMV and the
    block-scaled GEMM against their references."""
    from octavo.kernels.gemv import scaled_linear_gemv
    from octavo.kernels.quant.fp8_block_triton import block_scaled_mm

    try:
        weight = torch.randn(32, 128, device=device)
        x = torch.randn(2, 128, device=device, dtype=torch.bfloat16)
        expected = x.float() @ weight.t()
        qweight, scale = scaled_mm.quantize_fp8_per_channel(weight)
        per_channel = scaled_linear_gemv(x, qweight, scale, None).float()
        qblock, block_scale = scaled_mm.quantize_fp8_block(weight, 16, 64)
        block = block_scaled_mm(x, qblock, block_scale, 16, 64, None).float()
    except Exception as exc:  # noqa: BLE001 -- any failure means "not here"
        logger.info("Triton fp8 kernels do not run on %s: %s: %s", device, type(exc).__name__, exc)
        return False
    ok = all(bool((out - expected).norm() <= 0.1 * expected.norm()) for out in (per_channel, block))
    if not ok:
        logger.warning("Triton fp8 kernels give wrong results on %s; using the references", device)
    return ok
