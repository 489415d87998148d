"""Grouped integer weights (4- and 8-bit): Octavo's packed layout, its torch
reference, and the checkpoint packings it is converted from.

Octavo's one layout for a linear layer with ``K`` inputs, ``N`` outputs,
``bits`` in {4, 8} (``pack = 32 // bits`` values per int32) and groups of
``group_size`` inputs -- what the kernels read, made once at load:

* ``qweight`` int32 ``[N, K // pack]``, contiguous along the inputs, so a
  program streaming a few output rows reads long runs of memory. Inputs
  come in blocks of ``P * pack`` (``P = plane_words(K, bits)``: 16 when
  ``K`` is a multiple of ``16 * pack``, else 1): word ``i`` of a block holds
  inputs ``i + P * j`` of the block in bits ``[bits * j, bits * (j + 1))``.
  Each bit field ``j`` ("plane") of the block's ``P`` words is thus ``P``
  consecutive inputs, which a kernel multiplies by ``P`` consecutive
  activations (a 16-deep tensor-core product) without shuffling values;
* ``scales`` ``[N, G]`` in the activation dtype, ``G = K // group_size``;
* ``zeros`` ``[N, G]``: the integer zero point (uint8 for 4 bits: 0..16,
  16 occurring in legacy GPTQ files, whose stored zero is one less than the
  true one; int16 for 8 bits: 0..256);
* optional ``input_perm`` int ``[K]``: act-order checkpoints are permuted at
  load so that groups are contiguous, and the activations follow.

``W[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g]`` with ``g = k // group_size``,
computed in float32 and rounded once to the activation dtype (the Triton
kernels do the same, so both paths agree to the GEMM's accumulation order).
``group_size`` is a multiple of 16, so a plane never straddles two groups.
The matmuls are the ``int4_linear`` and ``int8_grouped_linear`` layer ops
(references in ``octavo.ops.quant_reference``, Triton kernels in
``int4_triton``).

Checkpoint packings (``*_rows`` / ``*_cols``: 8 nibbles per int32 along
the rows / columns of a ``[K, N]`` matrix; AWQ's interleaved column order)
are unpacked into plain values, then packed into this layout.
"""

from __future__ import annotations

import torch

PACK_FACTOR = 8  # 4-bit values per int32
# AWQ packs output columns into a word in this order: nibble i holds column
# ORDER[i] of its group of eight.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _to_int32_bits(value: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) -> int32 with the same 32 bits."""
    return torch.where(value >= 2**31, value - 2**32, value).to(torch.int32)


def _shifts(bits: int, device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.arange(0, 32, bits, dtype=dtype, device=device)


def pack_int4_rows(values: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """``[K, N]`` ints -> int32 ``[K * bits / 32, N]`` (``32 / bits`` consecutive
    rows per word, the first in the lowest bits): GPTQ's ``qweight``."""
    rows, cols = values.shape
    pack = 32 // bits
    grouped = values.to(torch.int64).reshape(rows // pack, pack, cols)
    return _to_int32_bits((grouped << _shifts(bits, values.device, torch.int64)[None, :, None]).sum(dim=1))


def unpack_int4_rows(packed: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Inverse of :func:`pack_int4_rows`: int32 ``[K * bits / 32, N]`` -> uint8 ``[K, N]``."""
    fields = (packed[:, None, :] >> _shifts(bits, packed.device)[None, :, None]) & ((1 << bits) - 1)
    return fields.reshape(packed.shape[0] * (32 // bits), packed.shape[1]).to(torch.uint8)


def pack_int4_cols(values: torch.Tensor, order: tuple[int, ...] | None = None, bits: int = 4) -> torch.Tensor:
    """``[R, N]`` ints -> int32 ``[R, N * bits / 32]``; field i holds column
    ``order[i]`` of each group of ``32 / bits`` (sequential when ``order`` is None)."""
    rows, cols = values.shape
    pack = 32 // bits
    grouped = values.to(torch.int64).reshape(rows, cols // pack, pack)
    if order is not None:
        grouped = grouped[..., list(order)]
    return _to_int32_bits((grouped << _shifts(bits, values.device, torch.int64)).sum(dim=-1))


def unpack_int4_cols(packed: torch.Tensor, order: tuple[int, ...] | None = None, bits: int = 4) -> torch.Tensor:
    """Inverse of :func:`pack_int4_cols`: int32 ``[R, N * bits / 32]`` -> uint8 ``[R, N]``."""
    pack = 32 // bits
    fields = (packed[:, :, None] >> _shifts(bits, packed.device)) & ((1 << bits) - 1)
    if order is not None:
        inverse = [0] * pack
        for position, column in enumerate(order):
            inverse[column] = position
        fields = fields[..., inverse]
    return fields.reshape(packed.shape[0], packed.shape[1] * pack).to(torch.uint8)


def plane_words(num_in: int, bits: int) -> int:
    """Words per block of the packed layout for ``num_in`` inputs (see the module docstring)."""
    pack = 32 // bits
    return 16 if num_in % (16 * pack) == 0 else 1


def linear_shapes(x: torch.Tensor, qweight: torch.Tensor, bits: int) -> tuple[int, int, int]:
    """``(tokens, out features, in features)`` of ``x @ W.T``, checking that ``x`` has the inputs ``qweight`` packs."""
    num_tokens, num_in = x.shape
    if qweight.shape[1] * (32 // bits) != num_in:
        raise ValueError(f"x has {num_in} features, qweight packs {qweight.shape[1] * (32 // bits)} ({bits}-bit)")
    return num_tokens, qweight.shape[0], num_in


def pack_grouped(values: torch.Tensor, bits: int) -> torch.Tensor:
    """``[N, K]`` ints in ``0 .. 2**bits - 1`` -> Octavo's int32 ``[N, K * bits / 32]``."""
    num_out, num_in = values.shape
    pack = 32 // bits
    if num_in % pack:
        raise ValueError(f"{num_in} inputs do not fill whole {bits}-bit words")
    planes = plane_words(num_in, bits)
    # [n, block, plane j, word i] -> [n, block, word i, plane j]
    grouped = values.to(torch.int64).reshape(num_out, -1, pack, planes).transpose(2, 3)
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=values.device)
    return _to_int32_bits((grouped << shifts).sum(dim=-1).reshape(num_out, num_in // pack))


def unpack_grouped(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_grouped`: int32 ``[N, K * bits / 32]`` -> uint8 / int16 ``[N, K]``."""
    num_out, num_words = qweight.shape
    pack = 32 // bits
    num_in = num_words * pack
    planes = plane_words(num_in, bits)
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=qweight.device)
    fields = (qweight[:, :, None] >> shifts) & ((1 << bits) - 1)  # [n, word, plane]
    values = fields.reshape(num_out, -1, planes, pack).transpose(2, 3).reshape(num_out, num_in)
    return values.to(torch.uint8)


def dequantize_grouped(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, bits: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The dense weight ``[N, K]`` of Octavo's grouped layout (see the module docstring)."""
    values = unpack_grouped(qweight, bits).to(torch.float32)
    group = torch.arange(values.shape[1], device=values.device) // group_size
    weight = (values - zeros[:, group].to(torch.float32)) * scales[:, group].to(torch.float32)
    return weight.to(dtype or scales.dtype)


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The dense weight ``[N, K]`` of Octavo's int4 layout."""
    return dequantize_grouped(qweight, scales, zeros, group_size, 4, dtype)


def zeros_dtype(bits: int) -> torch.dtype:
    return torch.uint8 if bits == 4 else torch.int16


def quantize_grouped_rtn(
    weight: torch.Tensor, group_size: int, bits: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric quantization with one scale and zero per group.

    ``weight`` is ``[N, K]``; returns ``(qweight, scales, zeros)`` in Octavo's
    layout, scales in ``weight``'s dtype. Error bound: ``|W - dq| <= scale``
    per element (half a step from rounding, and up to half a step more
    where the rounded zero point pushes the group's extreme past the top).
    """
    out_features, in_features = weight.shape
    top = float((1 << bits) - 1)
    groups = weight.to(torch.float32).reshape(out_features, in_features // group_size, group_size)
    low = groups.amin(dim=-1).clamp(max=0.0)
    high = groups.amax(dim=-1).clamp(min=0.0)
    scale = ((high - low) / top).clamp(min=torch.finfo(torch.float32).tiny)
    # Round the scale to the stored dtype first so that zeros and values are
    # computed against the scale the kernel will really use.
    scale = scale.to(weight.dtype).to(torch.float32).clamp(min=torch.finfo(torch.float32).tiny)
    zero = torch.round(-low / scale).clamp(0, top)
    values = torch.round(groups / scale[..., None] + zero[..., None]).clamp(0, top)
    qweight = pack_grouped(values.reshape(out_features, in_features), bits)
    return qweight, scale.to(weight.dtype).contiguous(), zero.to(zeros_dtype(bits)).contiguous()


def quantize_int4_rtn(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_grouped_rtn` with 4 bits (``--quantization int4``)."""
    return quantize_grouped_rtn(weight, group_size, 4)
