"""The CPU's compiled-decode linear (kernels/cpu_reduction_gemv.py): F.linear
outside a compiled graph, a product-and-sum inside one, resolved only where
inductor compiles the CPU's decode steps in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from octavo.kernels.cpu_reduction_gemv import linear_reduction
from octavo.ops.resolution import resolve_layer_ops
from octavo.platforms.cpu import CpuPlatform

CPU = torch.device("cpu")


def test_eager_call_is_f_linear_exactly():
    x, weight, bias = torch.randn(1, 24), torch.randn(40, 24), torch.randn(40)
    assert torch.equal(linear_reduction(x, weight, bias), F.linear(x, weight, bias))


@pytest.mark.parametrize("with_bias", [False, True])
def test_compiled_by_inductor_matches_f_linear(with_bias):
    torch._dynamo.reset()
    x, weight = torch.randn(1, 72), torch.randn(130, 72)  # rows and K not multiples of the vector width
    bias = torch.randn(130) if with_bias else None
    compiled = torch.compile(linear_reduction, backend="inductor", fullgraph=True)
    out = compiled(x, weight, bias)
    assert out.shape == (1, 130)
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_resolved_only_under_inductor_in_float32(monkeypatch):
    monkeypatch.delenv("OCTAVO_CPU_COMPILE", raising=False)
    assert resolve_layer_ops(CpuPlatform(), CPU, torch.float32).choice("linear").is_reference
    monkeypatch.setenv("OCTAVO_CPU_COMPILE", "1")
    choice = resolve_layer_ops(CpuPlatform(), CPU, torch.float32).choice("linear")
    assert choice.describe() == "linear: compiled_reduction [octavo_builtin] up to 1 token, else reference"
    assert resolve_layer_ops(CpuPlatform(), CPU, torch.bfloat16).choice("linear").is_reference
    monkeypatch.setenv("OCTAVO_CPU_COMPILE", "eager")  # traced, not generated: the product would be materialised
    assert resolve_layer_ops(CpuPlatform(), CPU, torch.float32).choice("linear").is_reference
