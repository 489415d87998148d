"""Grouped integers: GPTQ (4- and 8-bit) and AWQ checkpoints (hand-packed
from the formats' specs) and ``--quantization int4`` (round to nearest
while loading).

Evidence on a small random Llama (hidden 128, intermediate 256), float32:

* each linear layer's effective weight equals what the packed tensors mean
  (GPTQ's +1 zero convention for v1 files, act-order permutations, AWQ's
  interleaved order) and is within one quantization step of the original;
* logits equal (1e-4 relative) those of the unquantized model run on the
  dequantized weights -- the int4 path adds nothing beyond the format's
  rounding -- and are within ``LOGIT_TOLERANCE`` (relative L2) of the
  original model's (measured: 0.26-0.37 on this random model, whose
  2 layers x 7 projections compound 4-bit noise).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from octavo.errors import ModelLoadError, QuantizationError
from octavo.quantization.naming import checkpoint_names
from tests.quantization import helpers, packers

PROMPT = list(range(3, 120, 3))
LOGIT_TOLERANCE = 0.5

GPTQ_CASES = {
    "g32-asym-v1": dict(group_size=32, desc_act=False, sym=False, v2=False),
    "8bit-g64-asym-v1": dict(group_size=64, desc_act=False, sym=False, v2=False, bits=8),
    "8bit-g32-actorder-sym-v2": dict(group_size=32, desc_act=True, sym=True, v2=True, bits=8),
    "g64-actorder-sym-v1": dict(group_size=64, desc_act=True, sym=True, v2=False),
    "g128-actorder-asym-v2": dict(group_size=128, desc_act=True, sym=False, v2=True),
    "g-1-sym-v1": dict(group_size=-1, desc_act=False, sym=True, v2=False),
}


@pytest.fixture(scope="module")
def reference(quant_llama_dir):
    return helpers.prefill_logits(helpers.load(quant_llama_dir), PROMPT), helpers.checkpoint_tensors(quant_llama_dir)


def gptq_checkpoint(source, out, group_size, desc_act, sym, v2, bits=4):
    config = {
        "quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym,
        "checkpoint_format": "gptq_v2" if v2 else "gptq",
    }
    steps = {}

    def pack(module, w):
        perm = packers.input_perm(module, w.shape[1]) if desc_act else None
        packed = packers.pack_gptq(w, group_size, sym, v2, perm, bits)
        steps[module] = packed.scale_bound
        return {**packed.tensors, "_dequantized": packed.dequantized}

    meanings = packers.write_quantized_checkpoint(source, out, config, pack)
    return meanings, steps


def awq_checkpoint(source, out, group_size=64):
    config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
    steps = {}

    def pack(module, w):
        packed = packers.pack_awq(w, group_size)
        steps[module] = packed.scale_bound
        return {**packed.tensors, "_dequantized": packed.dequantized}

    return packers.write_quantized_checkpoint(source, out, config, pack), steps


def dequantized_checkpoint(source, out, meanings):
    """The original checkpoint with every linear weight replaced by its dequantized value."""
    from safetensors.torch import load_file, save_file
    import shutil

    shutil.copytree(source, out)
    tensors = load_file(str(source / "model.safetensors"))
    for module, value in meanings.items():
        tensors[f"{module}.weight"] = torch.from_numpy(value)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def check_layers(loaded, meanings, steps, tensors):
    for prefix, layer in helpers.linear_layers(loaded.model).items():
        names = checkpoint_names(prefix)
        got = helpers.effective_weight(layer)
        expected = torch.from_numpy(np.concatenate([meanings[n] for n in names]))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        step = torch.from_numpy(np.concatenate([steps[n] for n in names]))
        assert bool(((got - helpers.fused_reference(tensors, prefix)).abs() <= step * 1.0001).all()), prefix


def check_logits(loaded, meanings, source, tmp_path, reference):
    ref_logits, _ = reference
    logits = helpers.prefill_logits(loaded, PROMPT)
    fake = helpers.load(dequantized_checkpoint(source, tmp_path / "dequantized", meanings))
    fake_logits = helpers.prefill_logits(fake, PROMPT)
    assert float((logits - fake_logits).norm() / fake_logits.norm()) < 1e-4
    assert float((logits - ref_logits).norm() / ref_logits.norm()) < LOGIT_TOLERANCE


@pytest.mark.parametrize("case", list(GPTQ_CASES))
def test_gptq_checkpoint(case, quant_llama_dir, reference, tmp_path):
    meanings, steps = gptq_checkpoint(quant_llama_dir, tmp_path / "gptq", **GPTQ_CASES[case])
    loaded = helpers.load(tmp_path / "gptq")
    layers = helpers.linear_layers(loaded.model)
    act_order = GPTQ_CASES[case]["desc_act"]
    # Act-order permutes inputs only where there is more than one group.
    for layer in layers.values():
        assert (layer.input_perm is not None) == (act_order and layer.input_size > layer.group_size)
    bits = GPTQ_CASES[case].get("bits", 4)
    zeros_dtype = torch.uint8 if bits == 4 else torch.int16
    assert all(layer.qweight.dtype == torch.int32 and layer.zeros.dtype == zeros_dtype for layer in layers.values())
    assert all(layer.weight_bits == bits for layer in layers.values())
    check_layers(loaded, meanings, steps, reference[1])
    check_logits(loaded, meanings, quant_llama_dir, tmp_path, reference)


def test_awq_checkpoint(quant_llama_dir, reference, tmp_path):
    meanings, steps = awq_checkpoint(quant_llama_dir, tmp_path / "awq")
    loaded = helpers.load(tmp_path / "awq")
    check_layers(loaded, meanings, steps, reference[1])
    check_logits(loaded, meanings, quant_llama_dir, tmp_path, reference)


def test_int4_quantize_on_load(quant_llama_dir, reference):
    ref_logits, tensors = reference
    loaded = helpers.load(quant_llama_dir, "int4")
    for prefix, layer in helpers.linear_layers(loaded.model).items():
        assert layer.group_size == 128
        step = layer.scales.repeat_interleave(layer.group_size, dim=1).float()
        error = (helpers.effective_weight(layer) - helpers.fused_reference(tensors, prefix)).abs()
        assert bool((error <= step * 1.0001).all()), prefix
    logits = helpers.prefill_logits(loaded, PROMPT)
    assert float((logits - ref_logits).norm() / ref_logits.norm()) < LOGIT_TOLERANCE


def test_gptq_v1_zero_plus_one_is_not_wrapped():
    """AutoGPTQ v1 stores zero - 1 and every kernel adds 1 back without
    masking: a stored 15 means a zero of 16 (not 0)."""
    from octavo.models.layers.linear import ReplicatedLinear
    from octavo.quantization.gptq import GPTQConfig

    config = GPTQConfig.from_hf_config({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False})
    layer = ReplicatedLinear(32, 8, quant_config=config, prefix="layer")
    values = np.arange(32 * 8).reshape(32, 8) % 16
    layer.qweight.data.copy_(torch.from_numpy(packers._pack_nibbles(values, axis=0)))
    layer.qzeros.data.copy_(torch.from_numpy(packers._pack_nibbles(np.full((1, 8), 15), axis=1)))
    layer.scales.data.fill_(0.5)
    layer.quant_method.process_weights_after_loading(layer)
    expected = (torch.from_numpy(values).float() - 16) * 0.5
    torch.testing.assert_close(helpers.effective_weight(layer), expected.t())


def _edit_tensor(checkpoint, name, fn):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(checkpoint / "model.safetensors"))
    tensors[name] = fn(tensors[name])
    save_file(tensors, str(checkpoint / "model.safetensors"))


def test_gptq_bad_inputs(quant_llama_dir, tmp_path):
    gptq_checkpoint(quant_llama_dir, tmp_path / "a", 64, True, False, False)
    _edit_tensor(tmp_path / "a", "model.layers.0.mlp.down_proj.g_idx", lambda g: g + 100)
    with pytest.raises(QuantizationError, match=r"down_proj.g_idx refers to group \d+"):
        helpers.load(tmp_path / "a")
    gptq_checkpoint(quant_llama_dir, tmp_path / "b", 64, True, False, False)
    _edit_tensor(tmp_path / "b", "model.layers.1.self_attn.k_proj.g_idx", lambda g: g.flip(0))
    with pytest.raises(QuantizationError, match="qkv_proj: the fused projections have different g_idx"):
        helpers.load(tmp_path / "b")
    gptq_checkpoint(quant_llama_dir, tmp_path / "c", 64, False, False, False)
    _edit_tensor(tmp_path / "c", "model.layers.0.self_attn.o_proj.qweight", lambda q: q[:-1])
    with pytest.raises(ModelLoadError, match="o_proj"):
        helpers.load(tmp_path / "c")


@pytest.mark.parametrize(
    "update,message",
    [
        ({"bits": 3}, "GPTQ with 3 bits is not supported"),
        ({"group_size": 48}, "group size 48 does not fit"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
        ({"lm_head": True}, "quantized lm_head"),
    ],
)
def test_gptq_config_refusals(update, message, quant_llama_dir, tmp_path):
    gptq_checkpoint(quant_llama_dir, tmp_path / "g", 32, False, False, False)
    config_path = tmp_path / "g" / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"].update(update)
    config_path.write_text(json.dumps(config))
    with pytest.raises(QuantizationError, match=message):
        helpers.load(tmp_path / "g")


@pytest.mark.parametrize("update,message", [({"version": "gemv"}, "version 'gemv'"), ({"zero_point": False}, "zero_point")])
def test_awq_config_refusals(update, message, quant_llama_dir, tmp_path):
    awq_checkpoint(quant_llama_dir, tmp_path / "a")
    helpers.write_config(tmp_path / "a", quantization_config={**json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"], **update})
    with pytest.raises(QuantizationError, match=message):
        helpers.load(tmp_path / "a")
