"""8-bit matmuls: fp8 (e4m3) and int8, W8A8 and weight-only, in torch.

Weights are quantized per output channel (``scale[n] = amax(|W[n]|) / QMAX``),
activations per token, dynamically (``scale[m] = amax(|x[m]|) / QMAX``), so
``x @ W.T ~= (xq @ Wq.T) * sx[m] * sw[n]``.

* fp8 W8A8 uses ``torch._scaled_mm`` (row-wise scales), int8 W8A8 uses
  ``torch._int_mm``; both are probed once per device with a tiny call and
  used only where the probe passes (``fp8_w8a8_supported`` /
  ``int8_w8a8_supported``) and the weight's dims suit them
  (``w8a8_shape_ok``). On CUDA ``_int_mm`` needs more than 16 rows and
  ``_scaled_mm`` rows in multiples of 16, so inputs are padded with zero rows.
  fp8 GEMMs accumulate in the tensor cores' own precision, without the
  periodic promotion to float32 (``use_fast_accum``; vLLM's sm90 fp8
  kernels use the same "FP8FastAccum" schedules): ``OCTAVO_FP8_FAST_ACCUM=0``
  promotes, slower (``fp8_fast_accum``).
* Weight-only paths multiply by the 8-bit weight cast to the activation
  dtype (exact: every e4m3 and int8 value is representable in bf16/fp16)
  and apply the per-channel scale to the output, which is the same product.

Error bounds (per element of the dequantized weight): fp8 e4m3
``|W - dq| <= 2**-4 * |W| + 2**-10 * scale`` (3 mantissa bits, subnormals
below ``2**-6``); int8 ``|W - dq| <= scale / 2``.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
INT8_MAX = 127.0
MIN_SCALE = 1e-12
# torch._scaled_mm on CUDA has wanted rows in multiples of 16 (torch 2.4-2.6).
SCALED_MM_ROW_MULTIPLE = 16
FAST_ACCUM_ENV = "OCTAVO_FP8_FAST_ACCUM"


@functools.cache
def fp8_fast_accum() -> bool:
    """Whether fp8 W8A8 GEMMs skip the float32 promotion of their partial
    sums (``OCTAVO_FP8_FAST_ACCUM``: 1, the default, or 0); read once per process."""
    from octavo.errors import InvalidArgumentError

    value = os.environ.get(FAST_ACCUM_ENV, "1")
    if value not in ("0", "1"):
        raise InvalidArgumentError(f"{FAST_ACCUM_ENV}={value!r}: expected 1 (fast accumulation, the default) or 0")
    return value == "1"


def quantize_fp8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` -> (fp8 ``[N, K]``, float32 scale ``[N]``)."""
    w = weight.to(torch.float32)
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, K]`` -> (fp8 ``[M, K]``, float32 scale ``[M, 1]``)."""
    xf = x.to(torch.float32)
    scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_block(
    weight: torch.Tensor, block_n: int, block_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` -> (fp8 ``[N, K]``, float32 scale per ``block_n x block_k`` block,
    ``[ceil(N / block_n), ceil(K / block_k)]``): the layout of block-wise fp8
    checkpoints (their ``weight_scale_inv``)."""
    num_out, num_in = weight.shape
    rows, cols = -(-num_out // block_n), -(-num_in // block_k)
    padded = torch.zeros(rows * block_n, cols * block_k, dtype=torch.float32, device=weight.device)
    padded[:num_out, :num_in] = weight.to(torch.float32)
    blocks = padded.reshape(rows, block_n, cols, block_k)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).reshape(rows * block_n, cols * block_k)
    return q[:num_out, :num_in].to(FP8_DTYPE), scale


def dequantize_fp8_block(
    qweight: torch.Tensor, weight_scale: torch.Tensor, block_n: int, block_k: int, dtype: torch.dtype
) -> torch.Tensor:
    """The dense ``[N, K]`` weight of a block-scaled fp8 weight, in float32 rounded once to ``dtype``."""
    num_out, num_in = qweight.shape
    scale = weight_scale.to(torch.float32).repeat_interleave(block_n, 0)[:num_out]
    scale = scale.repeat_interleave(block_k, 1)[:, :num_in]
    return (qweight.to(torch.float32) * scale).to(dtype)


def quantize_int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` -> (int8 ``[N, K]``, float32 scale ``[N]``), symmetric."""
    w = weight.to(torch.float32)
    scale = (w.abs().amax(dim=1) / INT8_MAX).clamp(min=MIN_SCALE)
    return torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, K]`` -> (int8 ``[M, K]``, float32 scale ``[M, 1]``), symmetric."""
    xf = x.to(torch.float32)
    scale = (xf.abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=MIN_SCALE)
    return torch.round(xf / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def weight_only_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (Wq * s).T + b`` for an 8-bit (fp8 or int8) per-channel weight."""
    out = F.linear(x, qweight.to(x.dtype)) * weight_scale.to(x.dtype)
    return out if bias is None else out + bias


def _pad_rows(x: torch.Tensor, multiple: int, minimum: int) -> torch.Tensor:
    rows = max(minimum, -(-x.shape[0] // multiple) * multiple)
    if rows == x.shape[0]:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], x.shape[1])])


def _quantize_fp8_padded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xq, x_scale = quantize_fp8_per_token(x)
    if x.device.type == "cuda":
        multiple = SCALED_MM_ROW_MULTIPLE
        xq, x_scale = _pad_rows(xq, multiple, multiple), _pad_rows(x_scale, multiple, multiple)
    return xq, x_scale


def fp8_w8a8_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    quantize=_quantize_fp8_padded,
    matmul=None,
) -> torch.Tensor:
    """Dynamic per-token fp8 activations times a per-channel fp8 weight.
    ``quantize(x2) -> (xq, scale)`` may pad rows (``fp8_triton`` does it in one launch);
    ``matmul`` (``fp8_scaled_mm``'s arguments) defaults to ``fp8_scaled_mm``."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    xq, x_scale = quantize(x2)
    out = (matmul or fp8_scaled_mm)(xq, x_scale, qweight, weight_scale, bias, x2.shape[0], x.dtype)
    return out.reshape(*shape[:-1], -1)


def fp8_scaled_mm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    num_tokens: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``(xq * x_scale) @ (qweight * weight_scale).T + bias`` for the first
    ``num_tokens`` rows of quantized activations (``xq`` fp8 ``[M', K]``,
    ``x_scale`` float32 ``[M', 1]``, ``M' >= num_tokens``), in ``dtype``."""
    # Row-wise scaling wants a bfloat16 output; other dtypes are cast after.
    out = torch._scaled_mm(
        xq, qweight.t(), scale_a=x_scale, scale_b=weight_scale.reshape(1, -1), out_dtype=torch.bfloat16,
        use_fast_accum=fp8_fast_accum(),
    )
    out = out[:num_tokens].to(dtype)
    return out if bias is None else out + bias


def int8_w8a8_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Dynamic per-token int8 activations times a per-channel int8 weight."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    num_tokens = x2.shape[0]
    xq, x_scale = quantize_int8_per_token(x2)
    if x.device.type == "cuda":
        xq = _pad_rows(xq, 8, 24)
    acc = torch._int_mm(xq, qweight.t())[:num_tokens]
    out = (acc.to(torch.float32) * x_scale * weight_scale.reshape(1, -1)).to(x.dtype).reshape(*shape[:-1], -1)
    return out if bias is None else out + bias


def w8a8_reference(
    xq: torch.Tensor, x_scale: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor
) -> torch.Tensor:
    """The float32 product the W8A8 kernels approximate (tests)."""
    return (xq.to(torch.float32) @ qweight.to(torch.float32).t()) * x_scale * weight_scale.reshape(1, -1)


def w8a8_shape_ok(qweight: torch.Tensor, multiple: int) -> bool:
    """The 8-bit GEMMs want both weight dims in multiples of 16 (fp8) / 8 (int8) on CUDA."""
    return qweight.device.type != "cuda" or (qweight.shape[0] % multiple == 0 and qweight.shape[1] % multiple == 0)


@functools.cache
def fp8_w8a8_supported(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` runs on ``device`` (CUDA with compute
    capability >= 8.9). The CPU gets the weight-only path, like any platform
    without an fp8 matmul."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return False
    return _probe(fp8_w8a8_linear, quantize_fp8_per_channel, device)


@functools.cache
def int8_w8a8_supported(device: torch.device) -> bool:
    """Whether ``torch._int_mm`` runs on ``device``."""
    return _probe(int8_w8a8_linear, quantize_int8_per_channel, device)


def _probe(linear, quantize, device: torch.device) -> bool:
    try:
        weight = torch.randn(32, 64, device=device)
        x = torch.randn(3, 64, device=device, dtype=torch.bfloat16)
        qweight, scale = quantize(weight)
        out = linear(x, qweight, scale)
        expected = x.float() @ weight.t()
        ok = bool((out.float() - expected).norm() <= 0.1 * expected.norm())
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        logger.info("%s is not available on %s: %s", linear.__name__, device, exc)
        return False
    if not ok:
        logger.warning("%s gives wrong results on %s; using the weight-only path", linear.__name__, device)
    return ok
