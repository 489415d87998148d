"""gpt-oss's MXFP4 experts, dequantized while loading.

The decoding against transformers' own (``integrations/mxfp4.py``), bit for
bit in float32 and bfloat16; then a gpt-oss checkpoint whose experts are
MXFP4 blocks and scales loads exactly the weights of the same checkpoint
with those experts stored dequantized (whose outputs test_families.py
checks against transformers); unpaired or misplaced MXFP4 tensors are
refused by name.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from octavo.errors import ModelLoadError
from octavo.models.mxfp4 import dequantize_mxfp4, dequantized_mxfp4


def _random_mxfp4(generator: torch.Generator, experts: int, rows: int, columns: int):
    blocks = torch.randint(0, 256, (experts, rows, columns // 32, 16), generator=generator, dtype=torch.uint8)
    scales = torch.randint(121, 125, (experts, rows, columns // 32), generator=generator, dtype=torch.uint8)
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_matches_transformers(dtype):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(0)
    blocks, scales = _random_mxfp4(generator, 3, 8, 64)
    scales[0, 0, 0], scales[1, 2, 1] = 100, 140  # far from 127 both ways
    ours = dequantize_mxfp4(blocks, scales, dtype).transpose(1, 2)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
    assert ours.dtype == theirs.dtype == dtype
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def _mxfp4_pair(tmp_path, source):
    """Two copies of ``source``: experts as MXFP4 blocks and scales, and the same dequantized."""
    generator = torch.Generator().manual_seed(1)
    tensors = load_file(str(source / "model.safetensors"))
    quantized, dense = dict(tensors), dict(tensors)
    for name, tensor in tensors.items():
        if not name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            continue
        experts, columns, rows = tensor.shape  # HF's [E, in, out]
        blocks, scales = _random_mxfp4(generator, experts, rows, columns)
        del quantized[name]
        quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
        dense[name] = dequantize_mxfp4(blocks, scales, tensor.dtype).transpose(1, 2).contiguous()
    dirs = []
    for label, weights in (("mxfp4", quantized), ("dense", dense)):
        target = tmp_path / label
        shutil.copytree(source, target)
        save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
        dirs.append(target)
    config = json.loads((dirs[0] / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (dirs[0] / "config.json").write_text(json.dumps(config))
    return dirs


def _expert_params(path) -> dict[str, torch.Tensor]:
    from octavo.engine_args import EngineArgs, build_engine

    args = EngineArgs(model=str(path), dtype="float32", max_num_seqs=2, max_model_len=64, skip_tokenizer_init=True)
    engine = build_engine(args)
    try:
        model = engine.executor.worker.runner.model
        return {n: p.detach().clone() for n, p in model.named_parameters() if ".experts." in n}
    finally:
        engine.shutdown()


def test_mxfp4_checkpoint_loads_its_dequantized_weights(tmp_path, family_dir, one_thread):
    mxfp4, dense = _mxfp4_pair(tmp_path, family_dir("gpt_oss"))
    ours, expected = _expert_params(mxfp4), _expert_params(dense)
    assert sorted(ours) == sorted(expected) and any(n.endswith("w13_weight") for n in ours)
    for name, tensor in expected.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)


def test_unpaired_or_misplaced_mxfp4_tensors_are_refused():
    blocks, scales = _random_mxfp4(torch.Generator().manual_seed(2), 1, 2, 32)
    with pytest.raises(ModelLoadError, match="down_proj_blocks but no .*down_proj_scales"):
        list(dequantized_mxfp4([("model.layers.0.mlp.experts.down_proj_blocks", blocks)], torch.float32))
    with pytest.raises(ModelLoadError, match="experts' projections only"):
        list(dequantized_mxfp4([("model.layers.0.self_attn.q_proj.weight_blocks", blocks)], torch.float32))
    with pytest.raises(ModelLoadError, match="do not match"):
        dequantize_mxfp4(blocks, scales[..., :0], torch.float32)
