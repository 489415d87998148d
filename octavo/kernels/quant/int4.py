"""4-bit weights: Octavo's packed layout, its torch reference, and dispatch.

Octavo's one int4 layout (GPTQ's, without act-order) for a linear layer
with ``K`` inputs, ``N`` outputs and groups of ``group_size`` inputs:

* ``qweight`` int32 ``[K // 8, N]``: input ``k`` of output ``n`` is the
  nibble ``k % 8`` (bits ``4 * (k % 8)``) of ``qweight[k // 8, n]``;
* ``scales`` ``[G, N]`` in the activation dtype, ``G = K // group_size``;
* ``zeros`` uint8 ``[G, N]``: the integer zero point (0..16; 16 occurs in
  legacy GPTQ files, whose stored zero is one less than the true one);
* optional ``input_perm`` int ``[K]``: act-order checkpoints are permuted at
  load so that groups are contiguous, and the activations follow.

``W[n, k] = (q[k, n] - zeros[g, n]) * scales[g, n]`` with ``g = k // group_size``,
computed in float32 and rounded once to the activation dtype (the Triton
kernel does the same, so both paths agree to the GEMM's accumulation order).
GPTQ and AWQ checkpoints are converted into this layout after loading. The
matmul is the ``int4_linear`` layer op (reference in
``octavo.ops.quant_reference``, Triton kernel in ``int4_triton``).
"""

from __future__ import annotations

import torch

PACK_FACTOR = 8  # 4-bit values per int32
_SHIFTS = tuple(range(0, 32, 4))
# AWQ packs output columns into a word in this order: nibble i holds column
# ORDER[i] of its group of eight.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _to_int32_bits(value: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) -> int32 with the same 32 bits."""
    return torch.where(value >= 2**31, value - 2**32, value).to(torch.int32)


def _shifts(device: torch.device) -> torch.Tensor:
    return torch.tensor(_SHIFTS, dtype=torch.int32, device=device)


def pack_int4_rows(values: torch.Tensor) -> torch.Tensor:
    """``[K, N]`` ints in 0..15 -> int32 ``[K // 8, N]`` (8 consecutive rows per word)."""
    rows, cols = values.shape
    grouped = values.to(torch.int64).reshape(rows // PACK_FACTOR, PACK_FACTOR, cols)
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=values.device)
    return _to_int32_bits((grouped << shifts[None, :, None]).sum(dim=1))


def unpack_int4_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[K // 8, N]`` -> uint8 ``[K, N]``."""
    nibbles = (packed[:, None, :] >> _shifts(packed.device)[None, :, None]) & 0xF
    return nibbles.reshape(packed.shape[0] * PACK_FACTOR, packed.shape[1]).to(torch.uint8)


def pack_int4_cols(values: torch.Tensor, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """``[R, N]`` ints in 0..15 -> int32 ``[R, N // 8]``; nibble i holds column
    ``order[i]`` of each group of eight (sequential when ``order`` is None)."""
    rows, cols = values.shape
    grouped = values.to(torch.int64).reshape(rows, cols // PACK_FACTOR, PACK_FACTOR)
    if order is not None:
        grouped = grouped[..., list(order)]
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=values.device)
    return _to_int32_bits((grouped << shifts).sum(dim=-1))


def unpack_int4_cols(packed: torch.Tensor, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_int4_cols`: int32 ``[R, N // 8]`` -> uint8 ``[R, N]``."""
    nibbles = (packed[:, :, None] >> _shifts(packed.device)) & 0xF
    if order is not None:
        inverse = [0] * PACK_FACTOR
        for position, column in enumerate(order):
            inverse[column] = position
        nibbles = nibbles[..., inverse]
    return nibbles.reshape(packed.shape[0], packed.shape[1] * PACK_FACTOR).to(torch.uint8)


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The dense weight ``[N, K]`` of Octavo's int4 layout (see the module docstring)."""
    values = unpack_int4_rows(qweight).to(torch.float32)
    group = torch.arange(values.shape[0], device=values.device) // group_size
    weight = (values - zeros[group].to(torch.float32)) * scales[group].to(torch.float32)
    return weight.t().to(dtype or scales.dtype)


def quantize_int4_rtn(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric int4 with one scale and zero per group.

    ``weight`` is ``[N, K]``; returns ``(qweight, scales, zeros)`` in Octavo's
    layout, scales in ``weight``'s dtype. Error bound: ``|W - dq| <= scale``
    per element (half a step from rounding, and up to half a step more
    where the rounded zero point pushes the group's extreme past 15).
    """
    out_features, in_features = weight.shape
    groups = weight.to(torch.float32).reshape(out_features, in_features // group_size, group_size)
    low = groups.amin(dim=-1).clamp(max=0.0)
    high = groups.amax(dim=-1).clamp(min=0.0)
    scale = ((high - low) / 15.0).clamp(min=torch.finfo(torch.float32).tiny)
    # Round the scale to the stored dtype first so that zeros and values are
    # computed against the scale the kernel will really use.
    scale = scale.to(weight.dtype).to(torch.float32).clamp(min=torch.finfo(torch.float32).tiny)
    zero = torch.round(-low / scale).clamp(0, 15)
    values = torch.round(groups / scale[..., None] + zero[..., None]).clamp(0, 15)
    qweight = pack_int4_rows(values.reshape(out_features, in_features).t().to(torch.uint8))
    return qweight, scale.t().contiguous().to(weight.dtype), zero.t().contiguous().to(torch.uint8)
