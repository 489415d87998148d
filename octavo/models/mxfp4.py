"""MXFP4 (OCP microscaling FP4) tensors dequantized while loading.

gpt-oss's released checkpoints store each expert projection as two tensors
(``quantization_config`` ``{"quant_method": "mxfp4"}``, as transformers'
``integrations/mxfp4.py`` reads them):

* ``<name>_blocks`` uint8 ``[..., rows, G, 16]``: 32 FP4 (e2m1) values per
  block of a row, two a byte, the low nibble first;
* ``<name>_scales`` uint8 ``[..., rows, G]``: one E8M0 exponent per block,
  the block's values times ``2 ** (scale - 127)``.

Dequantized, a tensor is ``[..., rows, G * 32]`` with ``rows`` the output
features (a linear layer's layout); transformers then transposes the last
two dimensions into its experts' ``[E, in, out]`` parameters, and so does
``dequantized_mxfp4`` here, so that the result reads as the unquantized
checkpoint's tensor of the same name. Octavo has no MXFP4 kernels: the
experts run in the model dtype (an MXFP4 checkpoint's experts take about
four times their file size in bfloat16).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from octavo.errors import ModelLoadError

# e2m1: sign, two exponent bits, one mantissa bit; index = the 4-bit code.
FP4_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_BLOCK_BYTES = 16
# Rows of blocks decoded at a time: bounds the float32 temporary (~32 MiB).
_ROWS_PER_CHUNK = 1 << 18
# The tensors an MXFP4 checkpoint quantizes (anything else is refused).
MXFP4_TENSORS = (".experts.gate_up_proj", ".experts.down_proj")


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[..., G, 16]`` blocks and ``[..., G]`` scales -> ``[..., G * 32]`` in ``dtype``.

    Each value is decoded in float32 (exact: an e2m1 value times a power of
    two) and rounded once to ``dtype``."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ModelLoadError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != _BLOCK_BYTES or blocks.shape[:-1] != scales.shape:
        raise ModelLoadError(
            f"MXFP4 blocks of shape {tuple(blocks.shape)} do not match scales of shape {tuple(scales.shape)} "
            f"([..., G, {_BLOCK_BYTES}] and [..., G])"
        )
    groups = blocks.shape[-2]
    out = torch.empty(*blocks.shape[:-2], groups * 2 * _BLOCK_BYTES, dtype=dtype, device=blocks.device)
    flat_blocks, flat_scales = blocks.reshape(-1, _BLOCK_BYTES), scales.reshape(-1, 1)
    flat_out = out.view(-1, 2 * _BLOCK_BYTES)
    lut = torch.tensor(FP4_E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    for start in range(0, flat_blocks.shape[0], _ROWS_PER_CHUNK):
        rows = slice(start, start + _ROWS_PER_CHUNK)
        codes = flat_blocks[rows].to(torch.int32)
        values = torch.stack([lut[codes & 0x0F], lut[codes >> 4]], dim=-1).flatten(-2)  # low nibble first
        exponent = flat_scales[rows].to(torch.int32) - 127
        flat_out[rows] = torch.ldexp(values, exponent).to(dtype)
    return out


def dequantized_mxfp4(
    weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with each ``<name>_blocks`` / ``<name>_scales`` pair
    replaced by ``<name>``, dequantized and transposed to ``[E, in, out]``
    (the unquantized checkpoint's layout). Other tensors pass unchanged."""
    pending: dict[str, tuple[str, torch.Tensor]] = {}
    for name, tensor in weights:
        suffix = next((s for s in ("_blocks", "_scales") if name.endswith(s)), None)
        if suffix is None:
            yield name, tensor
            continue
        base = name[: -len(suffix)]
        if not base.endswith(MXFP4_TENSORS):
            raise ModelLoadError(f"{name}: MXFP4 tensors are read for the experts' projections only")
        other = pending.pop(base, None)
        if other is None or other[0] == suffix:
            pending[base] = (suffix, tensor)
            continue
        blocks, scales = (tensor, other[1]) if suffix == "_blocks" else (other[1], tensor)
        if blocks.dim() != 4:
            raise ModelLoadError(f"{base}_blocks: expected [experts, rows, groups, 16], got {tuple(blocks.shape)}")
        yield base, dequantize_mxfp4(blocks, scales, dtype).transpose(1, 2)
    if pending:
        base, (suffix, _) = next(iter(pending.items()))
        missing = "_scales" if suffix == "_blocks" else "_blocks"
        raise ModelLoadError(f"the checkpoint has {base}{suffix} but no {base}{missing}")
