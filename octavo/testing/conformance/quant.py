"""The ``quantization`` check: every quantization method the platform runs,
on its device, against the method's own dequantized reference.

For each method some plugin registers that the platform allows
(``supported_quantization``) and that quantizes a floating-point weight
while loading (formats that need a checkpoint of their own are skipped,
saying so): one linear layer is built twice from the same random weight and
bias, on the device with the platform's resolved layer ops and on the CPU
with the reference ops. The CPU layer applied to the identity gives the
dense weight the method means (its dequantized reference); the device
layer's output for random activations must be within
``RELATIVE_TOLERANCE`` of that weight's product (room for methods that also
quantize activations, W8A8). How far the dequantized weight is from the
original is reported, not judged: that is the format's own error bound.
"""

from __future__ import annotations

import torch

from octavo.errors import OctavoError
from octavo.ops import layer_ops_scope, reference_layer_ops, resolve_layer_ops
from octavo.testing.conformance.checks import ConformanceContext, ConformanceFailure, ConformanceSkip

IN_FEATURES, OUT_FEATURES = 256, 96
RELATIVE_TOLERANCE = 0.08


def _methods(platform) -> list[tuple[str, str, type]]:
    from octavo.plugins.manager import get_plugin_manager

    allowed = platform.supported_quantization
    found = {}
    for plugin, methods in get_plugin_manager().hook.octavo_quantization_methods.with_plugin_names():
        for name, cls in (methods or {}).items():
            found[name] = (plugin, cls)
    return [(name, plugin, cls) for name, (plugin, cls) in found.items() if allowed is None or name in allowed]


def _build(config, dtype: torch.dtype, device: torch.device, ops, weight: torch.Tensor, bias: torch.Tensor):
    from octavo.models.layers.linear import ReplicatedLinear

    with torch.device(device), layer_ops_scope(ops):
        layer = ReplicatedLinear(
            IN_FEATURES, OUT_FEATURES, bias=True, quant_config=config, prefix="conformance.proj", params_dtype=dtype
        )
    if "weight" not in layer._parameters:
        raise ConformanceSkip("its layers have no floating-point weight to quantize")
    layer.weight.data.copy_(weight.to(dtype))
    layer.bias.data.copy_(bias.to(dtype))
    layer.quant_method.process_weights_after_loading(layer)
    return layer


@torch.inference_mode()
def _method_errors(ctx: ConformanceContext, config, dtype: torch.dtype) -> tuple[float, float]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(OUT_FEATURES, IN_FEATURES, generator=generator) * 0.05
    bias = torch.randn(OUT_FEATURES, generator=generator) * 0.1
    reference = _build(config, dtype, torch.device("cpu"), reference_layer_ops(), weight, bias)
    on_device = _build(config, dtype, ctx.device, resolve_layer_ops(ctx.platform, ctx.device, dtype), weight, bias)
    identity = torch.eye(IN_FEATURES, dtype=dtype)
    dequantized = (reference(identity).float() - bias.to(dtype).float()).t()  # [N, K]
    x = torch.randn(7, IN_FEATURES, generator=generator).to(dtype)
    expected = x.float() @ dequantized.t() + bias.to(dtype).float()
    got = on_device(x.to(ctx.device)).to("cpu", torch.float32)
    ctx.platform.synchronize()
    output_error = float((got - expected).norm() / expected.norm())
    weight_error = float((dequantized - weight.to(dtype).float()).norm() / weight.norm())
    return output_error, weight_error


def check_quantization(ctx: ConformanceContext) -> str:
    checked, skipped = [], []
    for name, plugin, cls in _methods(ctx.platform):
        try:
            config = cls.from_hf_config(None)
        except OctavoError as exc:
            skipped.append(f"{name} [{plugin}] (needs a checkpoint: {exc.message})")
            continue
        try:
            errors = _check_method(ctx, name, plugin, config)
        except ConformanceSkip as exc:
            skipped.append(f"{name} [{plugin}] ({exc})")
            continue
        if errors:
            worst_output, worst_weight = max(e[0] for e in errors), max(e[1] for e in errors)
            checked.append(f"{name} [{plugin}] {worst_output:.1e} over {len(errors)} dtypes (weight error {worst_weight:.1e})")
    if not checked:
        raise ConformanceSkip("no quantization method to check here" + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
    summary = f"{len(checked)} methods match their dequantized references (relative error): {', '.join(checked)}"
    return summary + (f"; skipped: {', '.join(skipped)}" if skipped else "")


def _check_method(ctx: ConformanceContext, name: str, plugin: str, config) -> list[tuple[float, float]]:
    errors = []
    for dtype in [d for d in ctx.dtypes if d in config.supported_dtypes()]:
        output_error, weight_error = _method_errors(ctx, config, dtype)
        if not output_error <= RELATIVE_TOLERANCE:
            raise ConformanceFailure(
                f"{name} [{plugin}] {str(dtype).removeprefix('torch.')}: output is {output_error:.2e} (relative) "
                f"from its own dequantized weight's product (tolerance {RELATIVE_TOLERANCE})"
            )
        errors.append((output_error, weight_error))
    return errors
