"""Block-wise fp8 and compressed-tensors pack-quantized (W4A16 / W8A16) checkpoints.

Hand-packed from the formats' specs (``packers.py``) on the small random
Llama (hidden 128, intermediate 256, float32 on the CPU). Evidence:

* every linear layer's effective weight (its real ``apply`` on the
  identity) equals what the packed tensors mean;
* prompt logits within the format's bound of the unquantized model's
  (relative L2: fp8 ``LOGIT_TOLERANCE["fp8"]`` as for per-channel fp8;
  4-bit as for GPTQ);
* shapes the layout cannot hold are refused at load, naming the layer and
  the option.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.errors import QuantizationError
from octavo.quantization.naming import checkpoint_names
from tests.quantization import helpers, packers
from tests.quantization.test_fp8_int8 import LOGIT_TOLERANCE, PROMPT, relative_error
from tests.quantization.test_int4 import LOGIT_TOLERANCE as INT4_LOGIT_TOLERANCE


@pytest.fixture(scope="module")
def reference(quant_llama_dir):
    return helpers.prefill_logits(helpers.load(quant_llama_dir), PROMPT)


def _check_meaning(loaded, meanings) -> None:
    for prefix, layer in helpers.linear_layers(loaded.model).items():
        expected = torch.from_numpy(np.concatenate([meanings[n] for n in checkpoint_names(prefix)]))
        torch.testing.assert_close(helpers.effective_weight(layer), expected, rtol=1e-5, atol=1e-6)


def _block_fp8(quant_llama_dir, out, block):
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    return packers.write_quantized_checkpoint(quant_llama_dir, out, config, packers.fp8_block_pack(*block))


def test_block_fp8_checkpoint(quant_llama_dir, reference, tmp_path):
    meanings = _block_fp8(quant_llama_dir, tmp_path / "fp8", (32, 64))
    loaded = helpers.load(tmp_path / "fp8")
    qkv = helpers.linear_layers(loaded.model)["model.layers.0.self_attn.qkv_proj"]
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale.shape == (256 // 32, 128 // 64)
    assert "weight_scale_inv" not in dict(qkv.named_parameters())
    _check_meaning(loaded, meanings)
    assert relative_error(helpers.prefill_logits(loaded, PROMPT), reference) < LOGIT_TOLERANCE["fp8"]


@pytest.mark.parametrize(
    "block,message",
    [((48, 64), r"(qkv_proj: 128|gate_up_proj: 256) output features .* weight_block_size \[48, 64\]"), ((32, 48), "power of two")],
)
def test_block_fp8_refusals(block, message, quant_llama_dir, tmp_path):
    config = {"quant_method": "fp8", "weight_block_size": list(block)}
    packers.write_quantized_checkpoint(quant_llama_dir, tmp_path / "fp8", config, packers.fp8_pack(True))
    with pytest.raises(QuantizationError, match=message):
        helpers.load(tmp_path / "fp8")


def _packed_config(bits: int, group_size: int | None, sym: bool, act_order: bool) -> dict:
    weights = {
        "num_bits": bits, "type": "int", "symmetric": sym, "strategy": "group" if group_size else "channel",
        "group_size": group_size, "actorder": "group" if act_order else None, "dynamic": False,
    }
    return {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
        "ignore": ["lm_head"], "quantization_status": "compressed",
    }


PACKED_CASES = {
    "w4-g32-sym": (4, 32, True, False),
    "w4-g64-asym": (4, 64, False, False),
    "w4-g32-actorder": (4, 32, True, True),
    "w8-channel-sym": (8, None, True, False),
}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_compressed_tensors_packed(case, quant_llama_dir, reference, tmp_path):
    bits, group_size, sym, act_order = PACKED_CASES[case]

    def pack(module, w):
        perm = packers.input_perm(module, w.shape[1]) if act_order else None
        packed = packers.pack_compressed_tensors(w, bits, group_size, sym, perm)
        return {**packed.tensors, "_dequantized": packed.dequantized}

    meanings = packers.write_quantized_checkpoint(quant_llama_dir, tmp_path / "ct", _packed_config(*PACKED_CASES[case]), pack)
    loaded = helpers.load(tmp_path / "ct")
    layers = helpers.linear_layers(loaded.model)
    assert all(layer.weight_bits == bits for layer in layers.values())
    assert all((layer.input_perm is not None) == (act_order and layer.input_size > layer.group_size) for layer in layers.values())
    _check_meaning(loaded, meanings)
    tolerance = INT4_LOGIT_TOLERANCE if bits == 4 else LOGIT_TOLERANCE["int8"]
    assert relative_error(helpers.prefill_logits(loaded, PROMPT), reference) < tolerance


@pytest.mark.parametrize(
    "change,message",
    [({"num_bits": 2}, "4- and 8-bit"), ({"strategy": "tensor"}, "group or channel"), ({"group_size": 48}, "group size 48")],
)
def test_compressed_tensors_packed_refusals(change, message, quant_llama_dir, tmp_path):
    config = _packed_config(4, 32, True, False)
    config["config_groups"]["group_0"]["weights"].update(change)

    def pack(module, w):
        return dict(packers.pack_compressed_tensors(w, 4, 32, True).tensors)

    packers.write_quantized_checkpoint(quant_llama_dir, tmp_path / "ct", config, pack)
    with pytest.raises(QuantizationError, match=message):
        helpers.load(tmp_path / "ct")
