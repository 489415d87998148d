"""Quantized-GEMM kernels of other libraries, as ``quant_paths`` paths, on
the same weights as Octavo's (issue 17: "measure what exists").

Each path converts Octavo's layout exactly (``int4``: values ``q`` in
0..15, bf16 ``scales`` and uint8 ``zeros`` per group of 128, ``W = (q -
zero) * scale``; ``fp8``: e4m3 weight, float32 scale per channel) into the
library's, so that ``quant_gpu.py`` checks it against the same reference
and times it beside Octavo's paths in the same run:

* ``fbgemm_bf16i4_rowwise`` / ``fbgemm_bf16i4_shuffled``
  (fbgemm-gpu-genai): CUTLASS mixed-input GEMMs, bf16 activations x int4,
  ``W = (q - 8) * scale + zero`` with a bf16 zero (``(8 - zero) * scale``,
  rounded once: the one inexact step); the shuffled form is preshuffled at
  load (``preshuffle_i4``) and is the path Octavo takes where fbgemm is
  installed (``octavo/kernels/quant/fbgemm_int4.py``, timed through it). torchao's int4 workflow calls the same kernels
  through mslk, which PyPI only holds as an empty placeholder; torchao's
  other int4 kernel is tinygemm (``quant_paths``' ``torch_int4pack_mm``).
* ``gemlite_a16w4``: gemlite's Triton GEMV/GEMM (its H100 tile table on
  Hopper), ``W = (q - zero) * scale`` as Octavo's.
* ``fbgemm_f8f8bf16_rowwise``: fbgemm's row-wise fp8 GEMM, activations
  quantized by its own per-row kernel: against ``torch._scaled_mm``.

A library that is not installed, or whose binary does not load with this
torch, makes its paths unavailable (reported once, with the reason): the
wheels are carried to the GPU machine (``gpu_round.sh libs``).
"""

from __future__ import annotations

import os

import torch

from octavo.kernels.quant import int4
from octavo.kernels.quant.fbgemm_int4 import fbgemm_values, load_fbgemm

GROUP = 128


def _fbgemm_int4_parts(weights):
    pack_int4 = load_fbgemm()
    centred, group_scale, group_zero = fbgemm_values(*weights)
    return pack_int4(centred), group_scale, group_zero


def fbgemm_int4_rowwise(weights, config):
    packed, group_scale, group_zero = _fbgemm_int4_parts(weights)
    return lambda x: torch.ops.fbgemm.bf16i4bf16_rowwise(x, packed, group_scale, group_zero)


def fbgemm_int4_shuffled(weights, config):
    """Octavo's own path through fbgemm (``octavo/kernels/quant/fbgemm_int4.py``):
    its ``repack`` at load, then its ``int4_linear``."""
    from octavo.kernels.quant import fbgemm_int4

    qweight, scales, zeros = weights
    packed = fbgemm_int4.repack(qweight, scales, zeros, GROUP)
    if packed is None:
        raise ValueError("fbgemm's preshuffled layout does not take these shapes")
    return lambda x: fbgemm_int4.int4_linear(x, packed["qweight"], packed["scales"], packed["zeros"], GROUP, None)


def _gemlite_tiles() -> None:
    """gemlite picks a tile table by GPU name; an H200 (no table of its own) takes the H100's."""
    import gemlite

    name = torch.cuda.get_device_name().lower()
    if "h200" in name:
        gemlite.load_config(os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json"))


def gemlite_int4(weights, config):
    from gemlite.helper import A16Wn

    _gemlite_tiles()
    qweight, scales, zeros = weights
    values = int4.unpack_grouped(qweight, 4).to(torch.uint8)
    layer = A16Wn(device=str(values.device), dtype=torch.bfloat16).from_weights(
        values, scales.to(torch.bfloat16), zeros.to(torch.bfloat16), 4, GROUP
    )
    return lambda x: layer(x)


def fbgemm_fp8_rowwise(weights, config):
    load_fbgemm()
    qweight, weight_scale = weights
    scale = weight_scale.to(torch.float32).contiguous()

    def run(x):
        xq, x_scale = torch.ops.fbgemm.quantize_fp8_per_row(x)
        return torch.ops.fbgemm.f8f8bf16_rowwise(xq, qweight, x_scale, scale)

    return run


# (family, path name, make): appended to ``quant_paths.all_paths()``.
LIBRARY_PATHS = (
    ("int4", "fbgemm_bf16i4_rowwise", fbgemm_int4_rowwise),
    ("int4", "fbgemm_bf16i4_shuffled", fbgemm_int4_shuffled),
    ("int4", "gemlite_a16w4", gemlite_int4),
    ("fp8", "fbgemm_f8f8bf16_rowwise", fbgemm_fp8_rowwise),
)
