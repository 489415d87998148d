"""Octavo's own kernels as layer-op implementations (the built-in plugin's
``octavo_layer_ops``), registered exactly as a vendor's would be.

Triton kernels serve the ``cuda`` device type (NVIDIA, and AMD through
ROCm's HIP build of torch); they are listed only when Triton is installed,
and imported only on a platform they serve. ``torch._int_mm`` (int8 W8A8)
and ``torch._scaled_mm`` (fp8 W8A8, fed by a Triton activation quantizer
when Triton is there) serve wherever a one-off probe on the device says
they run. Within an op, earlier entries come first in its chain (a GEMV
with ``max_tokens`` before the matmul that takes the rest). Priority 0: a
vendor's implementation with a higher priority replaces any of these.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from octavo.env_switches import switch_from_env
from octavo.errors import InvalidArgumentError
from octavo.kernels.encoder_attention import accepts as _varlen_accepts
from octavo.kernels.encoder_attention import supported as _varlen_supported
from octavo.ops.impl import OpContext, OpImpl

GEMV_MAX_TOKENS_ENV = "OCTAVO_GEMV_MAX_TOKENS"
QUANT_GEMV_MAX_TOKENS_ENV = "OCTAVO_QUANT_GEMV_MAX_TOKENS"
NORM_GEMV_ENV = "OCTAVO_NORM_GEMV"
CUDA = ("cuda",)


def gemv_max_tokens() -> int:
    """Token counts up to this take the skinny-batch GEMV (``OCTAVO_GEMV_MAX_TOKENS``,
    default 1; 0 turns it off for A/B runs against cuBLAS). On the H200 it
    beats cuBLAS at 1 token only (a 4-layer chain: 1.15x at 1 token, 0.84x
    at 2, 0.56x at 4; round 15 of benchmarks/RESULTS.md)."""
    value = os.environ.get(GEMV_MAX_TOKENS_ENV, "1")
    if not value.isdigit() or int(value) > 8:
        raise InvalidArgumentError(f"{GEMV_MAX_TOKENS_ENV}={value!r}: expected a number of tokens from 0 (off) to 8")
    return int(value)


def quant_gemv_max_tokens() -> int:
    """Token counts up to this take the weight-only GEMV of 8-bit per-channel
    weights (``fp8_linear``, ``int8_weight_only_linear``) instead of the
    matmul (``OCTAVO_QUANT_GEMV_MAX_TOKENS``, default 2; 0 turns it off). The
    GEMV reads the 8-bit weight once; fp8 W8A8 pays a quantization launch and
    ``_scaled_mm`` at a tiny M. benchmarks/quant_sweep_gpu.py measures the
    crossover."""
    value = os.environ.get(QUANT_GEMV_MAX_TOKENS_ENV, "2")
    if not value.isdigit() or int(value) > 8:
        raise InvalidArgumentError(
            f"{QUANT_GEMV_MAX_TOKENS_ENV}={value!r}: expected a number of tokens from 0 (off) to 8"
        )
    return int(value)


def norm_gemv_enabled() -> bool:
    """``OCTAVO_NORM_GEMV=1`` registers the norm-inside-the-GEMV kernels
    (``norm_gemv.py``) for their ops, at the GEMV's token counts; off by
    default: on an H100 they were no faster than the launches they replace
    (round 38 of benchmarks/RESULTS.md)."""
    return switch_from_env(NORM_GEMV_ENV, default=False)


def _fp8_mm_runs(ctx: OpContext) -> str | None:
    from octavo.kernels.quant.scaled_mm import fp8_w8a8_supported

    return None if fp8_w8a8_supported(ctx.device) else "torch._scaled_mm does not run on this device"


def _fp8_triton_runs(ctx: OpContext) -> str | None:
    from octavo.kernels.quant.fp8_triton import fp8_kernels_supported

    return None if fp8_kernels_supported(ctx.device) else "Triton's fp8 kernels do not run on this device"


def _fbgemm_int4_runs(ctx: OpContext) -> str | None:
    from octavo.kernels.quant.fbgemm_int4 import runs_on

    return None if runs_on(ctx.device) else "fbgemm-gpu-genai's bf16 x int4 GEMM does not run on this device"


def _fbgemm_impls() -> list[OpImpl]:
    """fbgemm-gpu-genai's kernels, where it is installed (``octavo[fbgemm]``):
    int4 in its own weight layout (``quant/fbgemm_int4.py``). Its row-wise fp8
    GEMM is not taken: with float32 accumulation it made fp8 throughput 0.75x
    bf16 where ``_scaled_mm`` gives 1.34x (round 31, benchmarks/RESULTS.md)."""
    if importlib.util.find_spec("fbgemm_gpu") is None:
        return []
    module = "octavo.kernels.quant.fbgemm_int4"
    return [OpImpl("int4_linear", "fbgemm_shuffled", f"{module}:int4_linear", repack=f"{module}:repack",
                   device_types=CUDA, dtypes=(torch.bfloat16,), supports=_fbgemm_int4_runs)]


def _int_mm_runs(ctx: OpContext) -> str | None:
    from octavo.kernels.quant.scaled_mm import int8_w8a8_supported

    return None if int8_w8a8_supported(ctx.device) else "torch._int_mm does not run on this device"


def _w8a8_dims_ok(qweight) -> bool:
    """``torch._scaled_mm`` wants both weight dims in multiples of 16."""
    return qweight.shape[0] % 16 == 0 and qweight.shape[1] % 16 == 0


def _fp8_mm_shape_ok(x, qweight, weight_scale, bias) -> bool:
    return _w8a8_dims_ok(qweight)


def _int_mm_shape_ok(x, qweight, weight_scale, bias) -> bool:
    # CUDA's _int_mm wants dims in multiples of 8; the CPU's takes any.
    return qweight.device.type != "cuda" or (qweight.shape[0] % 8 == 0 and qweight.shape[1] % 8 == 0)


# The widest row the fused fp8 quantizers hold in one program (fp8_fused.py):
# Llama-3.1-70B's intermediate size, 28,672, pads to it.
FUSED_FP8_MAX_ROW = 32768


def _norm_fp8_accepts(min_tokens: int):
    """``accepts`` for ``fused_add_rms_norm_fp8_linear``: more than
    ``min_tokens`` rows (fewer take the composition: the norm, then the
    GEMV), a row one program holds, the norm's weight in the activation
    dtype, weight dims in multiples of 16 (``_scaled_mm``)."""

    def accepts(x, residual, norm_weight, eps, qweight, weight_scale, bias) -> bool:
        return (
            x.dim() == 2 and x.shape[0] > min_tokens and x.shape[1] <= FUSED_FP8_MAX_ROW
            and norm_weight.dtype == x.dtype and _w8a8_dims_ok(qweight)
        )

    return accepts


def _silu_fp8_accepts(min_tokens: int):
    """``accepts`` for ``silu_and_mul_fp8_linear``, as ``_norm_fp8_accepts``."""

    def accepts(x, qweight, weight_scale, bias) -> bool:
        return (
            x.dim() == 2 and x.shape[0] > min_tokens and x.shape[1] <= 2 * FUSED_FP8_MAX_ROW
            and _w8a8_dims_ok(qweight)
        )

    return accepts


def _env_setting(read) -> int:
    """``read()``, or 0 (off) for a malformed value: the CUDA platform
    refuses it at startup (``CudaPlatform.check_config``)."""
    try:
        return read()
    except InvalidArgumentError:
        return 0


def _quant_impls() -> list[OpImpl]:
    """The quantized GEMMs' Triton implementations (the GEMVs first: with
    ``max_tokens`` they serve decode and hand larger batches down the chain)."""
    quant = "octavo.kernels.quant"
    impls = []
    max_tokens = _env_setting(quant_gemv_max_tokens)
    # The quantizer fused into the op before an fp8 projection: for the
    # batches the GEMV above does not take (those take the composition).
    fused_fp8 = [
        OpImpl("fused_add_rms_norm_fp8_linear", "triton_quant+scaled_mm", f"{quant}.fp8_fused:fused_add_rms_norm_fp8_linear",
               device_types=CUDA, supports=_fp8_mm_runs, accepts=_norm_fp8_accepts(max_tokens)),
        OpImpl("silu_and_mul_fp8_linear", "triton_quant+scaled_mm", f"{quant}.fp8_fused:silu_and_mul_fp8_linear",
               device_types=CUDA, supports=_fp8_mm_runs, accepts=_silu_fp8_accepts(max_tokens)),
    ]
    if max_tokens:
        impls += [
            OpImpl("fp8_linear", "gemv", "octavo.kernels.gemv:scaled_linear_gemv", device_types=CUDA,
                   max_tokens=max_tokens, supports=_fp8_triton_runs),
            OpImpl("int8_weight_only_linear", "gemv", "octavo.kernels.gemv:scaled_linear_gemv", device_types=CUDA,
                   max_tokens=max_tokens),
        ]
    return impls + [
        OpImpl("fp8_linear", "triton_quant+scaled_mm", f"{quant}.fp8_triton:fp8_w8a8_linear", device_types=CUDA,
               supports=_fp8_mm_runs, accepts=_fp8_mm_shape_ok),
        OpImpl("fp8_block_linear", "triton", f"{quant}.fp8_block_triton:fp8_block_linear", device_types=CUDA,
               supports=_fp8_triton_runs),
        OpImpl("int4_linear", "triton", f"{quant}.int4_triton:int4_linear", device_types=CUDA),
        OpImpl("int8_grouped_linear", "triton", f"{quant}.int4_triton:int8_grouped_linear", device_types=CUDA),
        OpImpl("gguf_linear", "triton", f"{quant}.gguf_triton:gguf_linear", device_types=CUDA),
    ] + fused_fp8 + _fbgemm_impls()


def _norm_gemv_takes(x, residual, norm_weight, weight) -> bool:
    """The norm-in-GEMV kernels' conditions (``norm_gemv.py``) beyond the
    token count: contiguous rows, the norm's and the projection's weights
    in the activations' dtype."""
    return (
        x.dim() == 2 and x.shape[0] > 0 and x.is_contiguous() and residual.is_contiguous()
        and residual.shape == x.shape and norm_weight.dtype == x.dtype == weight.dtype
        and weight.stride(1) == 1 and norm_weight.is_contiguous()
    )


def _norm_linear_accepts(x, residual, norm_weight, eps, weight, bias) -> bool:
    return _norm_gemv_takes(x, residual, norm_weight, weight)


def _norm_route_accepts(x, residual, norm_weight, eps, router_weight, top_k, renormalize) -> bool:
    return _norm_gemv_takes(x, residual, norm_weight, router_weight) and 0 < top_k <= router_weight.shape[0]


def _norm_gemv_impls(max_tokens: int) -> list[OpImpl]:
    """The norm inside the decode GEMV (``norm_gemv.py``), where ``norm_gemv_enabled()``."""
    if not _env_setting(norm_gemv_enabled):
        return []
    module = "octavo.kernels.norm_gemv"
    return [
        OpImpl("fused_add_rms_norm_linear", "norm_gemv", f"{module}:fused_add_rms_norm_linear", device_types=CUDA,
               max_tokens=max_tokens, accepts=_norm_linear_accepts),
        OpImpl("fused_add_rms_norm_route", "norm_gemv", f"{module}:fused_add_rms_norm_route", device_types=CUDA,
               max_tokens=max_tokens, accepts=_norm_route_accepts),
    ]


def _cpu_decode_compiled_by_inductor(ctx: OpContext) -> str | None:
    if getattr(ctx.platform, "decode_compile_backend", None) == "inductor":
        return None
    return "the CPU's decode steps are not compiled by inductor (OCTAVO_CPU_COMPILE=1)"


def builtin_layer_ops() -> list[OpImpl]:
    scaled_mm = "octavo.kernels.quant.scaled_mm"
    impls = [
        OpImpl("int8_linear", "int_mm", f"{scaled_mm}:int8_w8a8_linear", supports=_int_mm_runs, accepts=_int_mm_shape_ok),
        # One-token GEMVs as a reduction inductor parallelises (cpu_reduction_gemv.py).
        OpImpl("linear", "compiled_reduction", "octavo.kernels.cpu_reduction_gemv:linear_reduction", platforms=("cpu",),
               dtypes=(torch.float32,), max_tokens=1, supports=_cpu_decode_compiled_by_inductor),
    ]
    torch_fp8 = OpImpl(
        "fp8_linear", "scaled_mm", f"{scaled_mm}:fp8_w8a8_linear", device_types=CUDA,
        supports=_fp8_mm_runs, accepts=_fp8_mm_shape_ok,
    )
    if importlib.util.find_spec("triton") is None:
        return impls + [torch_fp8]
    impls += _quant_impls() + [
        OpImpl("rms_norm", "triton", "octavo.kernels.rms_norm:rms_norm", device_types=CUDA),
        OpImpl("qk_rms_norm", "triton", "octavo.kernels.rms_norm:qk_rms_norm", device_types=CUDA),
        OpImpl("fused_add_rms_norm", "triton", "octavo.kernels.rms_norm:fused_add_rms_norm", device_types=CUDA),
        OpImpl("rms_norm_f32_scale", "triton", "octavo.kernels.rms_norm:rms_norm_f32_scale", device_types=CUDA),
        OpImpl(
            "fused_add_rms_norm_f32_scale", "triton", "octavo.kernels.rms_norm:fused_add_rms_norm_f32_scale",
            device_types=CUDA,
        ),
        OpImpl(
            "post_norm_add_rms_norm_f32_scale", "triton", "octavo.kernels.rms_norm:post_norm_add_rms_norm_f32_scale",
            device_types=CUDA,
        ),
        OpImpl("rotary_embedding", "triton", "octavo.kernels.rotary:apply_rotary", device_types=CUDA),
        OpImpl("rotary_and_cache", "triton", "octavo.kernels.rotary:rotary_and_cache", device_types=CUDA),
        OpImpl("silu_and_mul", "triton", "octavo.kernels.activation:silu_and_mul", device_types=CUDA),
        OpImpl("gelu_and_mul", "triton", "octavo.kernels.activation:gelu_and_mul", device_types=CUDA),
        OpImpl("gelu_tanh_and_mul", "triton", "octavo.kernels.activation:gelu_tanh_and_mul", device_types=CUDA),
        OpImpl("moe_topk_softmax", "triton", "octavo.kernels.moe_topk:topk_softmax", device_types=CUDA),
        OpImpl("fused_moe", "triton", "octavo.kernels.fused_moe:fused_moe", device_types=CUDA),
        OpImpl("fused_moe_routed", "triton", "octavo.kernels.moe_routed:fused_moe_routed", device_types=CUDA),
        OpImpl(
            "encoder_attention", "varlen_flash", "octavo.kernels.encoder_attention:varlen_encoder_attention",
            # NVIDIA's CUDA platform only: torch's varlen kernels on ROCm are not measured or tested here.
            platforms=("cuda",), device_types=CUDA, dtypes=(torch.bfloat16, torch.float16),
            supports=_varlen_supported, accepts=_varlen_accepts,
        ),
    ]
    max_tokens = _env_setting(gemv_max_tokens)
    if max_tokens:
        impls += _norm_gemv_impls(max_tokens) + [
            OpImpl("linear", "gemv", "octavo.kernels.gemv:linear_gemv", device_types=CUDA, max_tokens=max_tokens),
            OpImpl(
                "linear_silu_and_mul", "gemv", "octavo.kernels.gemv:gemv_silu_mul", device_types=CUDA,
                max_tokens=max_tokens,
            ),
            OpImpl(
                "linear_gelu_tanh_and_mul", "gemv", "octavo.kernels.gemv:gemv_gelu_tanh_mul", device_types=CUDA,
                max_tokens=max_tokens,
            ),
        ]
    return impls
