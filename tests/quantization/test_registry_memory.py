"""Choosing a quantization method, refusing it clearly, and reporting weight memory.

Weight-memory ratios are over the linear layers only (their bytes after
loading over the same layers in bfloat16; embeddings, norms and the LM head
stay in the model dtype and are reported apart), measured with the model in
bfloat16 on the small Llama (hidden 128): fp8/int8 0.51 (per-channel
float32 scales add 4 bytes per 128 weights), int4 0.26 (group 128: a bf16
scale and a uint8 zero per 128 weights).
"""

from __future__ import annotations

import json
import logging

import pytest

from octavo.errors import QuantizationError
from octavo.quantization.memory import measure_weight_memory, weight_memory_of
from octavo.quantization.registry import build_quant_config, quantization_methods
from tests.quantization import helpers

ALL_METHODS = {"fp8", "compressed-tensors", "int8", "int8_weight_only", "int4", "gptq", "awq", "gguf"}


def test_builtin_plugin_registers_every_method():
    from octavo.plugins.manager import get_plugin_manager

    assert ALL_METHODS <= set(quantization_methods())
    # Through the same entry-point plugin as a vendor's (no privileged path).
    impls = get_plugin_manager().pluggy.hook.octavo_quantization_methods.get_hookimpls()
    assert "octavo_builtin" in {impl.plugin_name for impl in impls}


def test_cpu_platform_runs_every_method():
    from octavo.platforms.cpu import CpuPlatform
    from octavo.quantization.registry import quantization_methods

    # None: every installed method (each has a plain-torch path).
    assert CpuPlatform.supported_quantization is None
    assert ALL_METHODS <= set(quantization_methods())


def test_platform_without_support_refuses():
    class NoQuant:
        name = "fakeaccel"
        supported_quantization = ("fp8",)

    with pytest.raises(QuantizationError, match="quantization 'int4' is not supported on platform 'fakeaccel' \\(supported there: fp8\\)"):
        build_quant_config("int4", None, NoQuant())


def test_unknown_method():
    with pytest.raises(QuantizationError, match="unknown quantization method 'nf4' \\(available: awq, compressed-tensors"):
        build_quant_config("nf4", None, None)


def test_quantized_checkpoint_cannot_be_requantized():
    with pytest.raises(QuantizationError, match="already quantized with 'gptq'; --quantization 'fp8' cannot be applied"):
        build_quant_config("fp8", {"quant_method": "gptq", "bits": 4}, None)
    assert build_quant_config("GPTQ", {"quant_method": "gptq", "bits": 4, "group_size": 128}, None).name == "gptq"


@pytest.mark.parametrize("name", ["gptq", "awq", "compressed-tensors", "gguf"])
def test_checkpoint_only_methods_refuse_plain_checkpoints(name):
    with pytest.raises(QuantizationError, match="needs|applies to .gguf files only"):
        build_quant_config(name, None, None)


@pytest.mark.parametrize("quantization,low,high", [("fp8", 0.5, 0.52), ("int8", 0.5, 0.52), ("int8_weight_only", 0.5, 0.52), ("int4", 0.25, 0.27)])
def test_weight_memory_ratio(quantization, low, high, quant_llama_dir):
    loaded = helpers.load(quant_llama_dir, quantization, dtype="bfloat16")
    memory = weight_memory_of(loaded.model)
    assert low <= memory.linear_ratio <= high
    # Sizing on the meta device (what `octavo env --model` does) agrees with a real load.
    measured = measure_weight_memory(str(quant_llama_dir), quantization, "bfloat16")
    assert (measured.linear_bytes, measured.total_bytes) == (memory.linear_bytes, memory.total_bytes)


def test_gptq_memory_ratio(quant_llama_dir, tmp_path):
    from tests.quantization.test_int4 import gptq_checkpoint

    gptq_checkpoint(quant_llama_dir, tmp_path / "g", 128, True, False, False)
    memory = weight_memory_of(helpers.load(tmp_path / "g", dtype="bfloat16").model)
    assert 0.25 <= memory.linear_ratio <= 0.28


def test_env_reports_model_memory(quant_llama_dir, capsys):
    from octavo.entrypoints.cli.main import main

    assert main(["env", "--model", str(quant_llama_dir), "--quantization", "int4"]) == 0
    out = capsys.readouterr().out
    ratio = measure_weight_memory(str(quant_llama_dir), "int4").linear_ratio
    assert "(int4): linear layers" in out and f"= {ratio:.3f} x bf16" in out
    assert 0.25 <= ratio <= 0.27


def test_load_logs_weight_memory(quant_llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="octavo.quantization.memory"):
        helpers.load(quant_llama_dir, "fp8", dtype="bfloat16")
    assert any("(fp8): linear layers" in r.getMessage() and "x bf16" in r.getMessage() for r in caplog.records)


def test_env_refuses_bad_quantization(quant_llama_dir, capsys):
    from octavo.entrypoints.cli.main import main

    config = json.loads((quant_llama_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert main(["env", "--model", str(quant_llama_dir), "--quantization", "awq"]) == 2
    assert "awq needs an AWQ checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("quantization", ["fp8", "int8", "int4", "gptq"])
def test_dummy_weights_with_quantization(quantization, quant_llama_dir, tmp_path, make_llm):
    """What `octavo bench --load-format dummy` does at real shapes: random
    weights, then the method's post-load processing (a GPTQ config.json
    without weights for "gptq")."""
    import shutil

    from octavo import SamplingParams

    path = tmp_path / "model"
    shutil.copytree(quant_llama_dir, path)
    requested = quantization
    if quantization == "gptq":
        helpers.write_config(path, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False})
        requested = None
    llm = make_llm(path, load_format="dummy", quantization=requested)
    output = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(output.outputs[0].token_ids) == 4
