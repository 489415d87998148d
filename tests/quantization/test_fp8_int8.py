"""fp8 and int8: quantize on load, fp8 checkpoints, compressed-tensors checkpoints.

Evidence per format, on a small random Llama (hidden 128), float32 on the CPU:

* every linear layer's effective weight (the layer applied to the identity,
  through its real ``apply``) is within the format's bound of the original
  weight -- fp8 e4m3: ``2**-4 |w| + 2**-10 scale``; int8: ``scale / 2``; for
  checkpoints, equal to what the packed tensors mean;
* prompt logits close to the unquantized model's: relative L2 error below
  ``LOGIT_TOLERANCE`` (measured on this model: fp8 0.09, int8 W8A8 0.03,
  int8 weight-only 0.02; random weights amplify errors more than trained ones).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import SamplingParams
from octavo.errors import QuantizationError
from octavo.quantization.naming import checkpoint_names
from tests.quantization import helpers, packers

PROMPT = list(range(3, 120, 3))
LOGIT_TOLERANCE = {"fp8": 0.15, "int8": 0.06, "int8_weight_only": 0.05}


@pytest.fixture(scope="module")
def reference(quant_llama_dir):
    loaded = helpers.load(quant_llama_dir)
    return helpers.prefill_logits(loaded, PROMPT), helpers.checkpoint_tensors(quant_llama_dir)


def relative_error(logits: torch.Tensor, ref: torch.Tensor) -> float:
    return float((logits - ref).norm() / ref.norm())


@pytest.mark.parametrize("quantization", ["fp8", "int8", "int8_weight_only"])
def test_quantize_on_load(quantization, quant_llama_dir, reference):
    ref_logits, tensors = reference
    loaded = helpers.load(quant_llama_dir, quantization)
    for prefix, layer in helpers.linear_layers(loaded.model).items():
        expected_dtype = torch.float8_e4m3fn if quantization == "fp8" else torch.int8
        assert layer.weight.dtype == expected_dtype and layer.weight_scale.shape == (layer.output_size,)
        original = helpers.fused_reference(tensors, prefix)
        error = (helpers.effective_weight(layer) - original).abs()
        scale = layer.weight_scale[:, None]
        bound = 2**-4 * original.abs() + 2**-10 * scale if quantization == "fp8" else scale / 2
        assert bool((error <= bound * 1.001 + 1e-7).all()), prefix
    error = relative_error(helpers.prefill_logits(loaded, PROMPT), ref_logits)
    assert error < LOGIT_TOLERANCE[quantization]


def test_cpu_paths(quant_llama_dir):
    """fp8 falls back to weight-only (its layer op's reference) on the CPU; int8
    runs W8A8 via torch._int_mm (the built-in plugin's int8_linear)."""
    fp8 = helpers.load(quant_llama_dir, "fp8")
    assert fp8.ops.choice("fp8_linear").is_reference
    int8 = helpers.load(quant_llama_dir, "int8")
    choice = int8.ops.choice("int8_linear")
    assert (choice.impl, choice.plugin) == ("int_mm", "octavo_builtin")


def _check_meaning(loaded, meanings) -> None:
    for prefix, layer in helpers.linear_layers(loaded.model).items():
        expected = torch.from_numpy(np.concatenate([meanings[n] for n in checkpoint_names(prefix)]))
        torch.testing.assert_close(helpers.effective_weight(layer), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("per_tensor", [True, False], ids=["per-tensor", "per-channel"])
def test_fp8_checkpoint(per_tensor, quant_llama_dir, reference, tmp_path):
    ref_logits, _ = reference
    out = tmp_path / "fp8"
    config = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    meanings = packers.write_quantized_checkpoint(quant_llama_dir, out, config, packers.fp8_pack(per_tensor))
    loaded = helpers.load(out)
    _check_meaning(loaded, meanings)
    if per_tensor:
        # Fused q/k/v keep their own per-tensor scales, one per shard's rows.
        qkv = helpers.linear_layers(loaded.model)["model.layers.0.self_attn.qkv_proj"]
        assert len(torch.unique(qkv.weight_scale)) == 3
    assert relative_error(helpers.prefill_logits(loaded, PROMPT), ref_logits) < LOGIT_TOLERANCE["fp8"]


def _int8_pack(module: str, w: np.ndarray) -> dict:
    scale = np.abs(w).max(axis=1, keepdims=True) / 127
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return {"weight": q, "weight_scale": scale.astype(np.float32), "_dequantized": q.astype(np.float32) * scale}


def _compressed_config(kind: str, activations: bool, fmt: str) -> dict:
    weights = {"num_bits": 8, "type": kind, "strategy": "channel", "symmetric": True, "dynamic": False}
    inputs = {"num_bits": 8, "type": kind, "strategy": "token", "symmetric": True, "dynamic": True}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs if activations else None}},
        "ignore": ["lm_head"],
        "quantization_status": "compressed",
    }


@pytest.mark.parametrize(
    "kind,activations,fmt",
    [("float", True, "float-quantized"), ("int", True, "int-quantized"), ("int", False, "naive-quantized")],
)
def test_compressed_tensors_checkpoint(kind, activations, fmt, quant_llama_dir, reference, tmp_path):
    ref_logits, _ = reference
    pack = packers.fp8_pack(per_tensor=False) if kind == "float" else _int8_pack
    out = tmp_path / "ct"
    meanings = packers.write_quantized_checkpoint(quant_llama_dir, out, _compressed_config(kind, activations, fmt), pack)
    loaded = helpers.load(out)
    _check_meaning(loaded, meanings)
    tolerance = LOGIT_TOLERANCE["fp8" if kind == "float" else "int8"]
    assert relative_error(helpers.prefill_logits(loaded, PROMPT), ref_logits) < tolerance


@pytest.mark.parametrize(
    "change,message",
    [
        ({"num_bits": 4}, "weights int4"),
        ({"strategy": "group"}, "only per-tensor, per-channel"),
        ({"symmetric": False}, "asymmetric weights"),
    ],
)
def test_compressed_tensors_refuses_other_schemes(change, message, quant_llama_dir, tmp_path):
    config = _compressed_config("int", True, "int-quantized")
    config["config_groups"]["group_0"]["weights"].update(change)
    out = tmp_path / "ct"
    packers.write_quantized_checkpoint(quant_llama_dir, out, config, _int8_pack)
    with pytest.raises(QuantizationError, match=message) as info:
        helpers.load(out)
    assert "group_0" in str(info.value)


def test_fp8_generate_end_to_end(quant_llama_dir, make_llm):
    llm = make_llm(quant_llama_dir, quantization="fp8")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": PROMPT[:9]}, "Once upon a time"], params)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [8, 8]
