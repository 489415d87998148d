"""Layer-op implementations with weights in a layout of their own
(``OpImpl.repack``, plugin API 1.2), on the CPU with a test plugin whose
``int4_linear`` keeps each layer's weight dequantized and transposed (a
stand-in for a vendor GEMM's tiles, such as fbgemm's preshuffled int4):
the layers it takes hold their weights that way and call it alone, the
others keep Octavo's layout; the model's tokens are unchanged; the
conformance kit checks it in its layout; malformed registrations are refused."""

from __future__ import annotations

import pytest
import torch

from octavo.ops import resolve_layer_ops
from octavo.platforms.cpu import CpuPlatform
from octavo.plugins.manager import broken_plugins
from tests.plugins.fake_plugins import sandbox  # noqa: F401

LAYOUT_PLUGIN = '''
OCTAVO_PLUGIN_API_VERSION = "1.2"
import torch
from octavo.kernels.quant import int4
from octavo.ops import OpImpl

calls = {{"repack": 0, "fn": 0}}

def repack(qweight, scales, zeros, group_size):
    if qweight.shape[0] % {multiple}:
        return None  # a layer this layout does not take
    calls["repack"] += 1
    dense = int4.dequantize_int4(qweight, scales, zeros, group_size, scales.dtype)
    return {{"qweight": dense.t().contiguous(), "scales": scales[:, :0], "zeros": zeros[:, :0]}}

def transposed_int4_linear(x, qweight, scales, zeros, group_size, bias):
    calls["fn"] += 1
    out = x @ qweight
    return out if bias is None else out + bias

@hookimpl
def octavo_layer_ops():
    return [OpImpl("int4_linear", "transposed", transposed_int4_linear, platforms=("cpu",), repack=repack)]
'''


def greedy(llm) -> list[list[int]]:
    from octavo import SamplingParams

    prompts = [{"prompt_token_ids": [5, 9, 23, 7, 41, 3]}, {"prompt_token_ids": [12, 8, 30]}]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def int4_layers(llm) -> list:
    model = llm.engine.executor.worker.runner.model
    return [m for m in model.modules() if getattr(m, "weight_bits", None) == 4]


@pytest.mark.parametrize("multiple", [1, 256, 4096])  # every layer, some (gate-up), none
def test_layers_the_layout_takes_call_it_alone(llama_dir, make_llm, sandbox, multiple):
    import importlib

    from octavo.plugins.manager import reset_plugin_manager

    expected = greedy(make_llm(llama_dir, quantization="int4"))
    sandbox.add("layout_ops", LAYOUT_PLUGIN.format(multiple=multiple))
    reset_plugin_manager()
    llm = make_llm(llama_dir, quantization="int4")
    plugin = importlib.import_module("layout_ops")
    layers = int4_layers(llm)
    taken = [layer for layer in layers if layer.own_layout_op is not None]
    assert taken == [layer for layer in layers if layer.output_size % multiple == 0]
    assert plugin.calls["repack"] == len(taken) and (multiple == 1) == (taken == layers) and (multiple == 4096) == (not taken)
    # Taken: the weight stored dequantized and transposed; the others keep Octavo's packed layout.
    assert all(layer.qweight.dtype == torch.float32 and layer.scales.numel() == 0 for layer in taken)
    assert all(layer.qweight.dtype == torch.int32 for layer in layers if layer not in taken)
    ops = layers[0].ops
    assert ops.choice("int4_linear").describe().startswith(
        "int4_linear: transposed [layout_ops] in its own weight layout for the layers it takes; others: reference"
    )
    assert greedy(llm) == expected
    assert (plugin.calls["fn"] > 0) == bool(taken)


def test_conformance_kit_checks_a_layout_in_its_layout(sandbox, tmp_path):
    from octavo.testing.conformance.checks import make_context
    from octavo.testing.conformance.ops import check_ops

    sandbox.add("layout_ops", LAYOUT_PLUGIN.format(multiple=16))
    ctx = make_context(CpuPlatform(), tmp_path)
    ctx.dtypes = [torch.float32]
    assert "int4_linear=transposed [layout_ops]" in check_ops(ctx)


@pytest.mark.parametrize(
    "entry, problem",
    [
        ('OpImpl("int4_linear", "x", fn, repack=repack, max_tokens=1)',
         "int4_linear=x: an implementation with its own weight layout takes every call (no max_tokens, accepts)"),
        ('OpImpl("rms_norm", "x", fn, repack=repack)', "rms_norm=x: layer op rms_norm takes no weights an implementation may repack"),
        ('OpImpl("int4_linear", "x", fn, repack=42)', "int4_linear=x: repack must be a callable or a 'module:function' string"),
    ],
)
def test_malformed_layouts_break_the_plugin(sandbox, entry, problem):
    sandbox.add(
        "bad_layout",
        'OCTAVO_PLUGIN_API_VERSION = "1.2"\nfrom octavo.ops import OpImpl\n'
        "def fn(*args):\n    return None\ndef repack(**weights):\n    return None\n"
        f"@hookimpl\ndef octavo_layer_ops():\n    return [{entry}]\n",
    )
    ops = resolve_layer_ops(CpuPlatform(), torch.device("cpu"), torch.float32)
    assert ops.layout("int4_linear") is None
    assert {b.name: b.error for b in broken_plugins()}["bad_layout"].startswith(f"hook octavo_layer_ops: {problem}")
