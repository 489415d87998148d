"""The conformance checks: each takes a ``ConformanceContext`` and returns a
one-line summary, or raises ``ConformanceFailure`` saying what is wrong (or
``ConformanceSkip`` when the platform legitimately cannot run it).

1. ``interface``: the class attributes are well-formed, the probe says
   available, a device computes a matmul equal to the CPU's, memory info is
   sane, ``synchronize`` returns.
2. ``kv_cache``: the attention backend's KV cache is allocated on the
   device, and its size is linear in the number of blocks (the runner sizes
   the cache from the size of one block).
3. ``attention``: for every dtype the platform supports and a few
   attention shapes (MHA, GQA, MQA with a sliding window), the platform's
   backend runs the mixed-batch scenario of ``batches`` (prefill and decode
   together, chunked prefill, prefix-cache hits, a step that writes no KV)
   and matches ``torch_paged`` run on the CPU in float32.
4. ``fused_rotary``: a backend that ``fuses_rotary``, called through
   ``forward_with_rotary`` with the platform's resolved ``rotary_and_cache``,
   matches the reference rotary followed by ``torch_paged`` (skipped when no
   backend of the platform fuses it).
5. ``ops``: every layer-op implementation serving this platform against
   its op's reference over a grid of shapes and dtypes (``ops.py``); the
   summary lists the ops that run their reference here.
6. ``quantization``: every quantization method the platform runs against
   its own dequantized reference (``quant.py``).
7. ``model``: a tiny random Llama checkpoint (built with transformers)
   runs end to end through ``LLM`` on this platform (KV cache sized by the
   platform's ``kv_cache_budget``), with chunked prefill and prefix-cache
   hits, and its greedy tokens match Hugging Face's in the same dtype on
   the platform's ``reference_device()`` (the summary names it).
8. ``plugin_models``: every model architecture a plugin registers, against
   the transformers class it reproduces (``plugin_models.py``).
9. ``two_devices``: tensor parallelism over two devices with the platform's
   distributed backend gives one device's tokens (skipped with fewer).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path

import torch

from octavo.core.attention import AttentionSpec
from octavo.platforms.interface import Platform
from octavo.runtime.attention.torch_paged import TorchPagedAttention
from octavo.testing.conformance.batches import RotaryInputs, mixed_scenario, run_scenario
from octavo.testing.conformance.op_cases import cos_sin_table

# Attention output tolerance (absolute, outputs are O(1)) per dtype.
ATTENTION_ATOL = {torch.float32: 2e-3, torch.bfloat16: 3e-2, torch.float16: 5e-3}
# (num_heads, num_kv_heads, head_size, sliding_window)
ATTENTION_SHAPES = ((4, 4, 32, None), (8, 2, 64, None), (4, 1, 128, 24))
BLOCK_SIZE = 16


class ConformanceFailure(AssertionError):
    """The platform does not conform; the message says how."""


class ConformanceSkip(Exception):
    """The check does not apply to this platform; the message says why."""


@dataclass
class ConformanceContext:
    platform: Platform
    workdir: Path
    dtypes: list[torch.dtype] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return self.platform.device(0)


def make_context(platform: Platform, workdir: Path) -> ConformanceContext:
    dtypes = [d for d in (torch.float32, torch.bfloat16, torch.float16) if d in platform.supported_dtypes]
    return ConformanceContext(platform, workdir, dtypes)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceFailure(message)


def check_interface(ctx: ConformanceContext) -> str:
    platform = ctx.platform
    cls = type(platform)
    for attribute in ("name", "device_type", "dist_backend"):
        _require(isinstance(getattr(cls, attribute, None), str), f"{attribute} must be a string")
    _require(bool(cls.supported_dtypes), "supported_dtypes is empty")
    _require(bool(cls.attention_backends), "attention_backends is empty")
    _require(cls.is_available() is True, f"is_available() is not True here: {cls.availability_detail()}")
    _require(isinstance(cls.availability_detail(), str), "availability_detail() must return a string")
    platform.set_device(0)
    num_devices = platform.device_count()
    _require(num_devices >= 1, f"device_count() is {num_devices}")
    a = torch.randn(16, 16)
    on_device = (a.to(ctx.device) @ a.to(ctx.device)).cpu()
    platform.synchronize()
    matches = torch.allclose(on_device, a @ a, atol=1e-3, rtol=1e-3)
    _require(matches, "a float32 matmul on the device differs from the CPU's")
    memory = platform.memory_info(0)
    _require(0 < memory.free_bytes <= memory.total_bytes, f"memory_info() is not sane: {memory}")
    return (
        f"{num_devices} device(s) of type {cls.device_type}, {memory.free_bytes / 2**30:.1f} of "
        f"{memory.total_bytes / 2**30:.1f} GiB free, dist backend {cls.dist_backend}"
    )


def _spec(shape: tuple, dtype: torch.dtype) -> AttentionSpec:
    num_heads, num_kv_heads, head_size, window = shape
    return AttentionSpec(num_heads, num_kv_heads, head_size, head_size**-0.5, dtype, dtype, BLOCK_SIZE, window)


def check_kv_cache(ctx: ConformanceContext) -> str:
    spec = _spec(ATTENTION_SHAPES[1], ctx.dtypes[0])
    backend = ctx.platform.attention_backend(spec)
    one, eight = (torch.Size(backend.kv_cache_shape(n)).numel() for n in (1, 8))
    _require(eight == 8 * one, f"{backend.name}: kv_cache_shape is not linear in blocks ({one} vs {eight} for 1 vs 8)")
    expected = 2 * spec.block_size * spec.num_kv_heads * spec.head_size
    _require(one >= expected, f"{backend.name}: one block holds {one} elements, fewer than K and V need ({expected})")
    cache = torch.zeros(backend.kv_cache_shape(8), dtype=spec.kv_cache_dtype, device=ctx.device)
    ctx.platform.synchronize()
    _require(cache.device.type == ctx.device.type, f"KV cache landed on {cache.device}, not {ctx.device}")
    nbytes = cache.numel() * cache.element_size()
    del cache
    return f"{backend.name}: 8 blocks, shape {tuple(backend.kv_cache_shape(8))}, {nbytes} bytes on {ctx.device.type}"


def check_attention(ctx: ConformanceContext) -> str:
    checked, skipped, worst = [], [], 0.0
    for dtype in ctx.dtypes:
        for shape in ATTENTION_SHAPES:
            spec = _spec(shape, dtype)
            label = f"{str(dtype).removeprefix('torch.')} heads={shape[0]}/{shape[1]} d={shape[2]} window={shape[3]}"
            try:
                backend = ctx.platform.attention_backend(spec)
            except Exception as exc:
                if shape[3] is None:
                    raise ConformanceFailure(f"{label}: no attention backend: {exc}") from exc
                skipped.append(f"{label} ({exc})")
                continue
            error = _attention_error(ctx, backend, spec)
            atol = ATTENTION_ATOL[dtype]
            message = f"{backend.name} {label}: max abs error {error:.2e} vs torch_paged (tolerance {atol})"
            _require(error <= atol, message)
            checked.append(backend.name)
            worst = max(worst, error)
    counts = ", ".join(f"{name} x{checked.count(name)}" for name in dict.fromkeys(checked))
    summary = f"{len(checked)} configurations match torch_paged (max abs error {worst:.1e}; backends used: {counts})"
    return summary + (f"; skipped: {', '.join(skipped)}" if skipped else "")


def _attention_error(ctx: ConformanceContext, backend, spec: AttentionSpec, rotary_op=None) -> float:
    """Max abs error of ``backend`` against torch_paged on the CPU in float32;
    with ``rotary_op``, through ``forward_with_rotary`` against the reference
    rotary followed by ``forward``."""
    scenario = mixed_scenario(spec, seed=len(ctx.dtypes))
    table = cos_sin_table(spec.head_size, 256) if rotary_op is not None else None
    fused = RotaryInputs(table, rotary_op) if rotary_op is not None else None
    outputs = run_scenario(scenario, backend, ctx.device, rotary=fused)
    ctx.platform.synchronize()
    reference_spec = _spec((spec.num_heads, spec.num_kv_heads, spec.head_size, spec.sliding_window), torch.float32)
    plain = RotaryInputs(table) if rotary_op is not None else None
    reference = run_scenario(
        scenario, TorchPagedAttention(reference_spec), torch.device("cpu"), input_dtype=spec.dtype, rotary=plain
    )
    error = 0.0
    for step, (ours, ref) in enumerate(zip(outputs, reference)):
        shapes = f"output shape {tuple(ours.shape)}, expected {tuple(ref.shape)}"
        _require(ours.shape == ref.shape, f"{backend.name}: step {step} {shapes}")
        _require(bool(torch.isfinite(ours).all()), f"{backend.name}: step {step} output is not finite")
        if scenario.steps[step].write_kv:  # outputs of a no-write step are not defined
            error = max(error, float((ours - ref).abs().max()))
    return error


def check_fused_rotary(ctx: ConformanceContext) -> str:
    """Backends that fuse the rotary embedding into the KV write, with the
    platform's resolved ``rotary_and_cache``, against rotary then attention."""
    from octavo.ops import resolve_layer_ops

    checked, unfused, worst = [], set(), 0.0
    for dtype in ctx.dtypes:
        op = resolve_layer_ops(ctx.platform, ctx.device, dtype).rotary_and_cache
        for shape in ATTENTION_SHAPES[:2]:
            spec = _spec(shape, dtype)
            backend = ctx.platform.attention_backend(spec)
            if not backend.fuses_rotary:
                unfused.add(backend.name)
                continue
            error = _attention_error(ctx, backend, spec, rotary_op=op)
            atol = ATTENTION_ATOL[dtype]
            label = f"{backend.name} {str(dtype).removeprefix('torch.')} heads={shape[0]}/{shape[1]}"
            _require(error <= atol, f"{label}: forward_with_rotary is {error:.2e} from rotary + torch_paged (tolerance {atol})")
            checked.append(backend.name)
            worst = max(worst, error)
    if not checked:
        raise ConformanceSkip(f"the platform's attention backends ({', '.join(sorted(unfused))}) do not fuse the rotary embedding")
    return f"{len(checked)} configurations of forward_with_rotary match rotary + torch_paged (max abs error {worst:.1e})"


def check_model(ctx: ConformanceContext) -> str:
    from octavo.testing.conformance.model import build_tiny_llama, compare_with_hf

    summaries = []
    path = build_tiny_llama(ctx.workdir / "tiny-llama")
    for dtype in ctx.dtypes[:2]:
        summaries.append(compare_with_hf(ctx.platform, path, dtype))
        gc.collect()
    return "; ".join(summaries)


def check_ops(ctx: ConformanceContext) -> str:
    from octavo.testing.conformance.ops import check_ops as run

    return run(ctx)


def check_quantization(ctx: ConformanceContext) -> str:
    from octavo.testing.conformance.quant import check_quantization as run

    return run(ctx)


def check_plugin_models(ctx: ConformanceContext) -> str:
    from octavo.testing.conformance.plugin_models import check_plugin_models as run

    return run(ctx)


def check_two_devices(ctx: ConformanceContext) -> str:
    from octavo.testing.conformance.plugin_models import check_two_devices as run

    return run(ctx)


CHECKS = {
    "interface": check_interface,
    "kv_cache": check_kv_cache,
    "attention": check_attention,
    "fused_rotary": check_fused_rotary,
    "ops": check_ops,
    "quantization": check_quantization,
    "model": check_model,
    "plugin_models": check_plugin_models,
    "two_devices": check_two_devices,
}
