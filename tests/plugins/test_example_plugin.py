"""The example out-of-tree plugin (plugins/octavo-example-accelerator): its
platform passes the conformance suite, its layer-op kernels are chosen and
run inside Octavo's layers, and its quantization method runs.

CI installs the package (so its entry point is used); from a bare checkout
the tests import it from its source tree through ``OCTAVO_PLUGINS``.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from octavo.errors import PlatformError, QuantizationError
from octavo.plugins.manager import broken_plugins, reset_plugin_manager
from octavo.plugins.selection import select_platform
from tests.plugins.fake_plugins import ENV_VARIABLES

SOURCE = Path(__file__).resolve().parents[2] / "plugins" / "octavo-example-accelerator" / "src"


@pytest.fixture
def example_plugin(monkeypatch):
    for variable in ENV_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    installed = any(ep.name == "example_accelerator" for ep in entry_points(group="octavo.plugins"))
    if not installed:
        monkeypatch.syspath_prepend(str(SOURCE))
        monkeypatch.setenv("OCTAVO_PLUGINS", "octavo_example_accelerator.plugin")
    reset_plugin_manager()
    yield
    reset_plugin_manager()


def test_example_platform_is_installed_but_never_chosen_by_itself(example_plugin, monkeypatch):
    selection = select_platform()
    assert selection.platform.name == "cpu" and broken_plugins() == []
    example = next(c for c in selection.candidates if c.name == "example")
    assert example.available and example.priority == -1
    monkeypatch.setenv("OCTAVO_PLATFORM", "example")
    assert select_platform().platform.name == "example"


def test_example_platform_passes_the_conformance_suite(example_plugin, tmp_path):
    from octavo.testing.conformance import run_conformance

    from octavo.testing.conformance.checks import CHECKS

    # Every check but "model": "plugin_models" runs the same end-to-end
    # comparison through the example's own architecture (CI runs them all).
    results = run_conformance("example", [name for name in CHECKS if name != "model"], workdir=tmp_path)
    assert [(r.name, r.status) for r in results] == [
        ("interface", "passed"),
        ("kv_cache", "passed"),
        ("attention", "passed"),
        ("fused_rotary", "skipped"),
        ("ops", "passed"),
        ("quantization", "passed"),
        ("plugin_models", "passed"),
        ("two_devices", "skipped"),
    ], results
    details = {r.name: r.detail for r in results}
    assert "example_paged x4, torch_paged x2" in details["attention"]  # sliding windows fall back
    assert "rms_norm=example [example_accelerator]" in details["ops"]
    assert "linear=example_skinny [example_accelerator]" in details["ops"]
    assert "partly: linear: example_skinny [example_accelerator] up to 4 tokens, else reference" in details["ops"]
    assert details["quantization"].startswith("1 methods match their dequantized references (relative error): example_int8")
    assert "ExampleLlamaForCausalLM [example_accelerator] vs LlamaForCausalLM: float32: 7/7" in details["plugin_models"]
    assert details["two_devices"] == "1 example device visible; this check needs 2"


def test_env_shows_the_example_kernels_chosen(example_plugin, capsys):
    from octavo.entrypoints.cli.main import main

    assert main(["env", "--platform", "example", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "    rms_norm: example [example_accelerator]\n" in out
    assert "    linear: example_skinny [example_accelerator] up to 4 tokens, else reference\n" in out
    assert "    fused_add_rms_norm: reference\n" in out


def test_example_kernels_run_inside_octavo_layers(example_plugin, llama_dir, make_llm, monkeypatch):
    from octavo_example_accelerator import ops

    from octavo import SamplingParams

    calls = []
    for name in ("example_rms_norm", "example_skinny_linear"):
        original = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = make_llm(llama_dir).generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids
    llm = make_llm(llama_dir, platform="example")
    assert llm.generate([[5, 6, 7, 8]], params)[0].outputs[0].token_ids == expected
    assert calls.count("example_rms_norm") == 6 and calls.count("example_skinny_linear") > 0


def test_int8_linear_method_quantizes_per_output_channel(example_plugin):
    from octavo_example_accelerator.quantization import ExampleInt8Config

    from octavo.models.layers.linear import ReplicatedLinear

    torch.manual_seed(0)
    layer = ReplicatedLinear(64, 32, bias=True, quant_config=ExampleInt8Config.from_hf_config(None), prefix="proj")
    weight, bias = torch.randn(32, 64), torch.randn(32)
    layer.weight.data.copy_(weight)
    layer.bias.data.copy_(bias)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.int8 and layer.weight_scale.shape == (32,)
    assert int(layer.weight.abs().max()) == 127
    x = torch.randn(5, 64)
    dequantized = layer.weight.float() * layer.weight_scale[:, None]
    assert torch.allclose(layer(x), x @ dequantized.T + bias, atol=1e-5)
    relative = (layer(x) - (x @ weight.T + bias)).norm() / (x @ weight.T + bias).norm()
    assert relative < 0.01


@pytest.mark.parametrize("platform", ["example", "cpu"])
def test_int8_runs_end_to_end(example_plugin, llama_dir, make_llm, platform):
    from octavo import SamplingParams

    llm = make_llm(llama_dir, platform=platform, quantization="example_int8")
    model = llm.engine.executor.worker.runner.model
    assert {p.dtype for name, p in model.named_parameters() if name.endswith("qkv_proj.weight")} == {torch.int8}
    outputs = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 8


def test_unsupported_dtype_on_example_platform(example_plugin, llama_dir, make_llm):
    with pytest.raises(PlatformError) as excinfo:
        make_llm(llama_dir, platform="example", dtype="float16")
    assert excinfo.value.message == "dtype float16 is not supported on example (supported: float32, bfloat16)"


def test_quantization_the_platform_does_not_list_is_refused(example_plugin, tmp_path, monkeypatch, llama_dir, make_llm):
    (tmp_path / "other_quant.py").write_text(
        'OCTAVO_PLUGIN_API_VERSION = "1.0"\n'
        "from octavo.plugins import hookimpl\n"
        "from octavo_example_accelerator.quantization import ExampleInt8Config\n"
        "class Other(ExampleInt8Config):\n    name = 'other_int8'\n"
        "@hookimpl\ndef octavo_quantization_methods():\n    return {'other_int8': Other}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    existing = os.environ.get("OCTAVO_PLUGINS")  # set when the example is not installed
    monkeypatch.setenv("OCTAVO_PLUGINS", ",".join(filter(None, [existing, "other_quant"])))
    reset_plugin_manager()
    with pytest.raises(QuantizationError) as excinfo:
        make_llm(llama_dir, platform="example", quantization="other_int8")
    assert excinfo.value.message == (
        "quantization 'other_int8' is not supported on platform 'example' (supported there: example_int8)"
    )
