"""GGUF files of mixture-of-experts models: Mixtral (llama architecture with
``expert_count``), qwen2moe (a shared expert, a dense first layer) and
qwen3moe, written from the small HF checkpoints with the ``gguf`` package
the way llama.cpp lays them out (experts stacked per projection).

Float files must give exactly what the safetensors checkpoint gives (tokens
and logprobs), which is itself checked against Hugging Face in
``test_families.py``; in quantized files every expert's weights must equal
the file's dequantized tensors. Missing expert tensors and metadata that
disagrees with them are refused, naming the tensor.
"""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from octavo.errors import ModelLoadError
from tests.quantization.gguf_writer import GGUFVariant, write_gguf

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
PROMPTS = [[5, 17, 99, 3, 250], list(range(40, 77)), [300, 301, 7]]



def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8, logprobs=2)


@pytest.mark.parametrize("family", ARCHITECTURES)
def test_float_file_matches_safetensors(family, family_dir, tmp_path, make_llm):
    from octavo.models.gguf_loader import gguf_arch_config

    source = family_dir(family)
    path = write_gguf(source, tmp_path / "model.gguf", family, {})  # all F32: the checkpoint's exact values
    assert gguf_arch_config(path).architecture == ARCHITECTURES[family]
    llm = make_llm(path, skip_tokenizer_init=family != "mixtral")
    expected = make_llm(source).generate([{"prompt_token_ids": p} for p in PROMPTS], greedy())
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy())
    for got, want in zip(outputs, expected):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        for g, w in zip(got.outputs[0].logprobs, want.outputs[0].logprobs):
            assert all(abs(g[t].logprob - w[t].logprob) < 1e-5 for t in w)


def test_quantized_experts_are_the_files_tensors(family_dir, tmp_path):
    import gguf

    from octavo.models.gguf_loader import gguf_arch_config, iterate_gguf_tensors

    types = {"ffn_gate_exps.weight": "Q8_0", "ffn_up_exps.weight": "F16", "ffn_down_exps.weight": "Q8_0",
             "attn_q.weight": "Q8_0", "ffn_gate_shexp.weight": "Q8_0"}
    path = write_gguf(family_dir("qwen2_moe"), tmp_path / "q8.gguf", "qwen2_moe", types)
    arch = gguf_arch_config(path)
    assert arch.architecture == "Qwen2MoeForCausalLM" and arch.moe.sparse_layers == (False, True)
    assert arch.moe.shared_expert_intermediate_size == 48 and not arch.moe.renormalize
    tensors = dict(iterate_gguf_tensors(path, arch))
    reader = gguf.GGUFReader(str(path))
    for part in ("gate", "up", "down"):
        stored = next(t for t in reader.tensors if t.name == f"blk.1.ffn_{part}_exps.weight")
        expected = torch.from_numpy(gguf.quants.dequantize(stored.data, stored.tensor_type).copy())
        for expert in range(8):
            torch.testing.assert_close(tensors[f"model.layers.1.mlp.experts.{expert}.{part}_proj.weight"], expected[expert])
    # The shared expert's gate-up stays quantized (raw rows for the gguf method).
    assert "model.layers.1.mlp.shared_expert.gate_proj.qweight" in tensors
    assert tensors["model.layers.1.mlp.shared_expert_gate.weight"].shape == (1, 64)


def test_missing_expert_tensor_is_named(family_dir, tmp_path):
    from octavo.models.gguf_loader import gguf_arch_config

    path = write_gguf(family_dir("mixtral"), tmp_path / "m.gguf", "mixtral", {}, GGUFVariant(skip=("blk.1.ffn_up_exps.weight",)))
    with pytest.raises(ModelLoadError, match="tensor 'blk.1.ffn_up_exps.weight' is missing"):
        gguf_arch_config(path)


def test_expert_count_disagreeing_with_tensors(family_dir, tmp_path):
    from octavo.models.gguf_loader import gguf_arch_config

    path = write_gguf(family_dir("mixtral"), tmp_path / "m.gguf", "mixtral", {}, GGUFVariant(config_overrides={"num_local_experts": 4}))
    with pytest.raises(ModelLoadError, match=r"ffn_gate_inp.weight' has shape \[8, 64\], but the metadata implies \[4, 64\]"):
        gguf_arch_config(path)
