"""The layer-op registry (plugin API 1.1): resolution, per-call dispatch,
overrides, and plugins that register bad entries."""

from __future__ import annotations

import pytest
import torch

from octavo.errors import InvalidArgumentError, PlatformError
from octavo.ops import current_layer_ops, layer_ops_scope, reference, reference_layer_ops, resolve_layer_ops
from octavo.platforms.cpu import CpuPlatform
from octavo.plugins.manager import broken_plugins

CPU = torch.device("cpu")

VENDOR = '''
OCTAVO_PLUGIN_API_VERSION = "1.1"
from octavo.ops import OpImpl, reference

calls = []

def my_rms_norm(x, weight, eps):
    calls.append("rms_norm")
    return reference.rms_norm(x, weight, eps)

def my_gemv(x, weight, bias):
    calls.append("gemv")
    return reference.linear(x, weight, bias)

def low_priority_rms_norm(x, weight, eps):
    raise AssertionError("outranked: never called")

def my_silu_and_mul(x):
    return reference.silu_and_mul(x)

@hookimpl
def octavo_layer_ops():
    return [
        OpImpl("rms_norm", "vendor", my_rms_norm, platforms=("cpu",), priority=10),
        OpImpl("rms_norm", "slow", low_priority_rms_norm, platforms=("cpu",), priority=5),
        OpImpl("linear", "gemv", "{module}:my_gemv", device_types=("cpu",), max_tokens=1),
        OpImpl("silu_and_mul", "bf16_only", my_silu_and_mul, dtypes=(torch.bfloat16,)),
        OpImpl("gelu_and_mul", "elsewhere", "not_installed_here:gelu_and_mul", platforms=("cuda",)),
    ]
'''


def resolve(dtype=torch.float32):
    return resolve_layer_ops(CpuPlatform(), CPU, dtype)


def broken() -> dict[str, str]:
    return {b.name: b.error for b in broken_plugins()}


def test_resolution_follows_priority_platform_and_dtype(sandbox):
    sandbox.add("vendor_ops", VENDOR.format(module="vendor_ops"))
    ops = resolve()
    assert ops.choice("rms_norm").describe() == "rms_norm: vendor [vendor_ops]"
    assert ops.choice("linear").describe() == "linear: gemv [vendor_ops] up to 1 token, else reference"
    assert ops.choice("silu_and_mul").is_reference  # registered for bfloat16 only
    assert ops.choice("silu_and_mul").skipped == ("bf16_only [vendor_ops] (for dtypes bfloat16)",)
    assert ops.choice("gelu_and_mul").is_reference and not ops.choice("gelu_and_mul").skipped  # another platform's
    assert ops.choice("linear_silu_and_mul").describe() == "linear_silu_and_mul: composed (linear, silu_and_mul)"
    assert resolve(torch.bfloat16).choice("silu_and_mul").impl == "bf16_only"
    assert broken() == {}


def test_per_call_max_tokens_and_composed_fallback(sandbox):
    sandbox.add("vendor_ops", VENDOR.format(module="vendor_ops"))
    from vendor_ops import calls

    ops = resolve()
    weight = torch.randn(6, 4)
    for num_tokens in (1, 3):
        x = torch.randn(num_tokens, 4)
        torch.testing.assert_close(ops.linear(x, weight, None), x @ weight.T)
    assert calls == ["gemv"]  # 3 tokens went to the reference
    # A fused op with no implementation composes the resolved ops it fuses.
    ops.linear_silu_and_mul(torch.randn(1, 4), weight, None)
    assert calls == ["gemv", "gemv"]


def test_layers_take_the_table_of_the_scope_they_are_built_in(sandbox):
    from octavo.models.layers.norm import RMSNorm

    sandbox.add("vendor_ops", VENDOR.format(module="vendor_ops"))
    vendor = resolve()
    with layer_ops_scope(vendor):
        fast = RMSNorm(4)
    plain = RMSNorm(4)  # outside any scope: the references, as another model in this process
    assert fast.ops is vendor and plain.ops is reference_layer_ops() and current_layer_ops() is plain.ops
    from vendor_ops import calls

    x = torch.randn(2, 4)
    torch.testing.assert_close(fast(x), plain(x))
    assert calls == ["rms_norm"]


@pytest.mark.parametrize(
    "entry, problem",
    [
        ('OpImpl("rms_nrom", "x", reference.rms_norm)', "layer op 'rms_nrom' does not exist"),
        ('OpImpl("rms_norm", "reference", reference.rms_norm)', "rms_norm: implementation name 'reference' is empty or reserved"),
        ('OpImpl("rms_norm", "x", reference.rms_norm, max_tokens=0)', "rms_norm=x: max_tokens must be a positive int"),
        ('OpImpl("rms_norm", "x", 42)', "rms_norm=x: fn must be a callable or a 'module:function' string, got 42"),
        ('"rms_norm"', "an entry is a str, expected octavo.ops.OpImpl"),
        (
            'OpImpl("silu_and_mul_fp8_linear", "x", reference.silu_and_mul)',
            "silu_and_mul_fp8_linear=x: layer op 'silu_and_mul_fp8_linear' is new in plugin API 1.2, "
            "but the plugin declares OCTAVO_PLUGIN_API_VERSION 1.1",
        ),
    ],
)
def test_malformed_entries_break_the_plugin_when_it_loads(sandbox, entry, problem):
    sandbox.add(
        "bad_ops",
        'OCTAVO_PLUGIN_API_VERSION = "1.1"\nfrom octavo.ops import OpImpl, reference\n'
        f"@hookimpl\ndef octavo_layer_ops():\n    return [{entry}]\n",
    )
    assert resolve().choice("rms_norm").is_reference
    assert broken()["bad_ops"].startswith(f"hook octavo_layer_ops: {problem}")


def test_a_1_0_plugin_cannot_implement_the_1_1_hook(sandbox):
    sandbox.add(
        "old_ops",
        'OCTAVO_PLUGIN_API_VERSION = "1.0"\n@hookimpl\ndef octavo_layer_ops():\n    return []\n',
    )
    assert broken()["old_ops"] == (
        "it implements octavo_layer_ops, new in plugin API 1.1, but declares OCTAVO_PLUGIN_API_VERSION 1.0"
    )


HALF_GOOD = '''
OCTAVO_PLUGIN_API_VERSION = "1.1"
from octavo.ops import OpImpl, reference

def good_norm(x, weight, eps):
    return reference.rms_norm(x, weight, eps)

{bad}

@hookimpl
def octavo_layer_ops():
    return [OpImpl("rms_norm", "good", good_norm, platforms=("cpu",)), {entry}]
'''
BAD_AT_RESOLUTION = [
    ("def bad(x, weight):\n    return x", 'OpImpl("silu_and_mul", "bad", bad)', "silu_and_mul=bad: TypeError: signature"),
    ("", 'OpImpl("silu_and_mul", "bad", "no_such_module:fn")', "silu_and_mul=bad: ModuleNotFoundError"),
    (
        "def refuse(ctx):\n    raise RuntimeError('probe crashed')",
        'OpImpl("silu_and_mul", "bad", reference.silu_and_mul, supports=refuse)',
        "silu_and_mul=bad: supports raised RuntimeError: probe crashed",
    ),
]


@pytest.mark.parametrize("bad, entry, problem", BAD_AT_RESOLUTION, ids=["signature", "import", "supports"])
def test_a_plugin_failing_at_resolution_is_never_half_installed(sandbox, bad, entry, problem):
    sandbox.add("half_good", HALF_GOOD.format(bad=bad, entry=entry))
    ops = resolve()
    assert ops.choice("rms_norm").is_reference and ops.choice("silu_and_mul").is_reference
    assert broken()["half_good"].startswith(f"layer op {problem}")


def test_overrides_force_an_implementation_or_the_reference(sandbox, monkeypatch):
    sandbox.add("vendor_ops", VENDOR.format(module="vendor_ops"))
    monkeypatch.setenv("OCTAVO_LAYER_OPS", "rms_norm=slow, linear=reference, cuda:rms_norm=reference")
    ops = resolve()
    assert ops.choice("rms_norm").describe() == "rms_norm: slow [vendor_ops] (forced by OCTAVO_LAYER_OPS)"
    assert ops.choice("linear").is_reference and ops.choice("linear").forced
    monkeypatch.setenv("OCTAVO_LAYER_OPS", "rms_norm=slow,cpu:rms_norm=reference")  # scoped wins on its platform
    assert resolve().choice("rms_norm").is_reference


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "rms_norm=triton",
            "OCTAVO_LAYER_OPS: rms_norm=triton does not serve this model on cpu (octavo_builtin: for device types cuda) "
            "(installed: reference, triton [octavo_builtin], vendor [vendor_ops], slow [vendor_ops])",
        ),
        (
            "silu_and_mul=bf16_only",
            "OCTAVO_LAYER_OPS: silu_and_mul=bf16_only does not serve this model on cpu "
            "(vendor_ops: for dtypes bfloat16) (installed: reference, triton [octavo_builtin], bf16_only [vendor_ops])",
        ),
    ],
)
def test_a_forced_implementation_that_cannot_serve_stops_startup(sandbox, monkeypatch, value, message):
    pytest.importorskip("triton")
    sandbox.add("vendor_ops", VENDOR.format(module="vendor_ops"))
    monkeypatch.setenv("OCTAVO_LAYER_OPS", value)
    with pytest.raises(PlatformError) as excinfo:
        resolve()
    assert excinfo.value.message == message


def test_overrides_are_checked_in_the_engine_process(sandbox, monkeypatch, llama_dir, make_llm):
    monkeypatch.setenv("OCTAVO_LAYER_OPS", "rms_norm=turbo")
    with pytest.raises(PlatformError, match=r"no implementation 'turbo' of rms_norm is installed \(installed: reference"):
        make_llm(llama_dir)
    monkeypatch.setenv("OCTAVO_LAYER_OPS", "rms_norm")
    with pytest.raises(InvalidArgumentError, match="malformed entry 'rms_norm'"):
        make_llm(llama_dir)
    monkeypatch.setenv("OCTAVO_LAYER_OPS", "group_norm=reference")
    with pytest.raises(InvalidArgumentError, match="unknown layer op 'group_norm'"):
        make_llm(llama_dir)


def test_a_vendor_kernel_runs_inside_a_model(sandbox, llama_dir, make_llm):
    from octavo import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    expected = make_llm(llama_dir).generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids
    sandbox.add("vendor_ops", VENDOR.format(module="vendor_ops"))
    from octavo.plugins.manager import reset_plugin_manager

    reset_plugin_manager()
    from vendor_ops import calls

    llm = make_llm(llama_dir)
    assert llm.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids == expected
    # rms_norm without a residual: the first layer's input norm, once in each of the 4 steps.
    assert calls.count("rms_norm") == 4 and calls.count("gemv") > 0


WRONG_KERNEL = '''
OCTAVO_PLUGIN_API_VERSION = "1.1"
from octavo.ops import OpImpl, reference

def norm_without_eps(x, weight, eps):
    return reference.rms_norm(x, weight, 0.5)

def silu_in_place(x):
    out = reference.silu_and_mul(x)
    x.zero_()
    return out

def router_off_by_one(router_logits, top_k, renormalize):
    weights, ids = reference.moe_topk_softmax(router_logits, top_k, renormalize)
    return weights, (ids + 1) % router_logits.shape[-1]

@hookimpl
def octavo_layer_ops():
    return [OpImpl("{op}", "broken_kernel", {fn}, platforms=("cpu",))]
'''


@pytest.mark.parametrize(
    "op, fn, problem",
    [
        ("rms_norm", "norm_without_eps", "rms_norm=broken_kernel [wrong_kernel] float32, 1 tokens x 64: output 0: max abs error"),
        (
            "silu_and_mul", "silu_in_place",
            "silu_and_mul=broken_kernel [wrong_kernel] float32, 1 tokens x 2*300: it modified its argument x",
        ),
        (  # expert ids are compared exactly (a tolerance would pass near ids in bfloat16)
            "moe_topk_softmax", "router_off_by_one",
            "moe_topk_softmax=broken_kernel [wrong_kernel] float32, 1 tokens, 128 experts top-8, renormalised: "
            "output 1: 8 of 8 values differ",
        ),
    ],
)
def test_the_conformance_kit_names_the_op_that_fails(sandbox, tmp_path, op, fn, problem):
    from octavo.testing.conformance.checks import ConformanceFailure, make_context
    from octavo.testing.conformance.ops import check_ops

    sandbox.add("wrong_kernel", WRONG_KERNEL.format(op=op, fn=fn))
    ctx = make_context(CpuPlatform(), tmp_path)
    with pytest.raises(ConformanceFailure) as excinfo:
        check_ops(ctx)
    assert str(excinfo.value).startswith(problem)


def test_the_conformance_grid_has_cases_for_every_op():
    # An op without cases failed the kit only where an implementation of it
    # served (fp8_block_linear on CUDA), never on the CPU.
    from octavo.ops import OP_SPECS
    from octavo.testing.conformance.op_cases import OP_CASES

    assert set(OP_CASES) == set(OP_SPECS)
    for op, cases in OP_CASES.items():
        args = cases[0].make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        assert len(args) == len(OP_SPECS[op].params), op
        OP_SPECS[op].reference(*args)  # the reference takes the case


def test_docs_state_every_ops_contract():
    from pathlib import Path

    from octavo.ops import OP_SPECS

    docs = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    for name, spec in OP_SPECS.items():
        assert f"| `{name}` | `({', '.join(spec.params)})` |" in docs, name


def test_env_reports_a_plugin_broken_at_resolution(sandbox, capsys):
    from octavo.entrypoints.cli.main import main

    bad, entry, _ = BAD_AT_RESOLUTION[0]
    sandbox.add("half_good", HALF_GOOD.format(bad=bad, entry=entry))
    assert main(["env", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "  broken plugin half_good (skipped): layer op silu_and_mul=bad: TypeError: signature" in out
    assert "    rms_norm: reference\n" in out  # its good implementation was not installed either
