"""``int4_linear`` through fbgemm-gpu-genai's preshuffled bf16 x int4 GEMM
(CUTLASS, Hopper), in its own weight layout (``OpImpl.repack``).

Measured on an H100 (round 29 of ``benchmarks/RESULTS.md``, one
Llama-3.1-8B layer's four projections, us): 148 at 1 token (Octavo's
Triton GEMV 207, tensor-core kernel 167), 149 at 16, 218 at 256 tokens
(bf16 cuBLAS 239, Octavo's dequantize + cuBLAS 450), 1,092 at 2,048 (bf16
1,129): the only int4 path found that keeps up with bf16 at throughput
batch sizes. fbgemm-gpu-genai is an optional dependency (``pip install
octavo[fbgemm]``; its wheel is built against one torch release): where it
is missing, its probe fails or a layer's shapes do not suit it, Octavo's
own int4 kernels serve.

Layout. Octavo's ``W = (q - zero) * scale`` (``q`` 0..15, integer zero,
16-bit scale per group) is fbgemm's ``W = (q - 8) * scale + zero'`` with
``zero' = (8 - zero) * scale`` rounded once to bfloat16 (the one inexact
step: within 2**-8 of ``8 * scale``); the centred values are packed two a
byte and preshuffled, with the scales, by ``torch.ops.fbgemm.preshuffle_i4``.
Layers take it with bfloat16 scales, groups of 128 and both dimensions in
multiples of 128 (what the kernel was measured on); others stay in
Octavo's layout.
"""

from __future__ import annotations

import functools
import logging

import torch

from octavo.kernels.quant import int4 as layout

logger = logging.getLogger(__name__)

GROUP = 128
MULTIPLE = 128


def load_fbgemm():
    """fbgemm-gpu-genai's ops registered (``torch.ops.fbgemm``); returns its ``pack_int4``."""
    import fbgemm_gpu.experimental.gen_ai  # noqa: F401 -- registers torch.ops.fbgemm
    from fbgemm_gpu.experimental.gen_ai.quantize import pack_int4

    return pack_int4


def fbgemm_values(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor):
    """Octavo's int4 weights in fbgemm's convention, unpacked: (centred values
    ``q - 8`` int8 ``[N, K]``, bf16 scales ``[G, N]``, bf16 zeros ``[G, N]``)."""
    centred = (layout.unpack_grouped(qweight, 4).to(torch.int16) - 8).to(torch.int8)
    group_scale = scales.t().contiguous().to(torch.bfloat16)
    group_zero = ((8 - zeros.to(torch.float32)) * scales.to(torch.float32)).t().contiguous().to(torch.bfloat16)
    return centred, group_scale, group_zero


def takes(qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> bool:
    """Whether a layer suits the kernel: groups of 128, dims in multiples of 128, bf16 scales."""
    num_out, num_in = qweight.shape[0], qweight.shape[1] * 8
    return (
        group_size == GROUP and scales.dtype == torch.bfloat16
        and num_out % MULTIPLE == 0 and num_in % MULTIPLE == 0
    )


def repack(qweight, scales, zeros, group_size):
    """The layer's weights in fbgemm's preshuffled layout, or None where the kernel does not take it."""
    if not takes(qweight, scales, group_size):
        return None
    pack_int4 = load_fbgemm()
    centred, group_scale, group_zero = fbgemm_values(qweight, scales, zeros)
    shuffled, shuffled_scale = torch.ops.fbgemm.preshuffle_i4(pack_int4(centred), group_scale)
    return {"qweight": shuffled, "scales": shuffled_scale, "zeros": group_zero}


def int4_linear(x, qweight, scales, zeros, group_size, bias):
    """The ``int4_linear`` op for a layer ``repack`` took."""
    shape = x.shape
    out = torch.ops.fbgemm.bf16i4bf16_shuffled(x.reshape(-1, shape[-1]), qweight, scales, zeros)
    out = out.reshape(*shape[:-1], -1)
    return out if bias is None else out + bias


def probe(device: torch.device, what: str, compute, tolerance: float) -> bool:
    """A one-off check that one of fbgemm's kernels loads and is right on
    ``device`` (Hopper or later, the library built for this torch):
    ``compute() -> (out, expected)`` within ``tolerance`` relative error."""
    if device.type != "cuda" or torch.version.hip is not None or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    try:
        out, expected = compute()
    except Exception as exc:  # noqa: BLE001 -- any failure means "not here"
        logger.info("fbgemm's %s does not run on %s: %s: %s", what, device, type(exc).__name__, exc)
        return False
    ok = bool((out.float() - expected.float()).norm() <= tolerance * expected.float().norm())
    if not ok:
        logger.warning("fbgemm's %s gives wrong results on %s; Octavo's own kernels serve", what, device)
    return ok


@functools.cache
def runs_on(device: torch.device) -> bool:
    """Whether fbgemm's int4 kernel loads and matches the reference on ``device``."""

    def compute():
        weight = torch.randn(256, 512, device=device, dtype=torch.bfloat16) * 0.02
        qweight, scales, zeros = layout.quantize_int4_rtn(weight, GROUP)
        packed = repack(qweight, scales, zeros, GROUP)
        x = torch.randn(3, 512, device=device, dtype=torch.bfloat16)
        expected = x.float() @ layout.dequantize_int4(qweight, scales, zeros, GROUP, torch.float32).t()
        return int4_linear(x, packed["qweight"], packed["scales"], packed["zeros"], GROUP, None), expected

    return probe(device, "bf16 x int4 GEMM", compute, 2e-2)
