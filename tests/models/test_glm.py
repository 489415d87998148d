"""Partial rotary in config.json and GLM's particulars beyond the family
tests (tests/models/test_families.py), against HF where it computes:
where ``partial_rotary_factor`` is read from and GLM's implied 0.5;
GLM-4-0414's four norms, each with weights of its own (random checkpoints
keep norms at one, which would not tell them apart); which q/k tensors the
rotary row order applies to; and the run-time interleaved rotation that
pre-quantized checkpoints take instead."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from octavo.errors import UnsupportedModelError
from octavo.models.config import load_arch_config, parse_arch_config
from octavo.models.glm import rotary_rows_in_rotate_half_order
from tests.hf_reference import hf_greedy
from tests.models.test_hf_parity import check_against_hf, make_prompts

TINY = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=300)


def arch(model_type: str = "phi3", **fields):
    return parse_arch_config(dict(architectures=["X"], model_type=model_type, **TINY, **fields))


def matches_hf(llm, path) -> None:
    """Two prompts, 8 greedy tokens: ids as HF's, chosen logprobs within 1e-4."""
    prompts = [p for p in make_prompts(load_arch_config(path).vocab_size, seed=3) if len(p) in (9, 40)]
    refs = [hf_greedy(path, p, 8) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8, logprobs=5)
    check_against_hf(llm.generate([{"prompt_token_ids": p} for p in prompts], params), refs)


def test_partial_rotary_factor_sources():
    assert (arch().partial_rotary_factor, arch().rotary_dim) == (1.0, 16)
    assert arch(partial_rotary_factor=0.75).rotary_dim == 12  # top level (transformers 4)
    nested = arch(partial_rotary_factor=None, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5})
    assert nested.rotary_dim == 8  # inside rope_parameters (transformers 5)
    # GLM's configs mean 0.5 when they leave it out, as HF's GlmConfig does.
    assert arch("glm4", head_dim=128).rotary_dim == 64 and arch("glm").partial_rotary_factor == 0.5
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor 0.5 with head_dim 2"):
        arch(head_dim=2, partial_rotary_factor=0.5)  # one dim: no pair to rotate


@pytest.mark.usefixtures("one_thread")
def test_glm4_norms_with_weights_of_their_own_match_hf(family_dir, make_llm, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    path = shutil.copytree(family_dir("glm4"), tmp_path / "glm4")
    weights = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(5)
    for name, tensor in weights.items():
        if "norm" in name:
            weights[name] = 1.0 + 0.5 * torch.randn(tensor.shape, generator=generator)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    matches_hf(make_llm(path), path)


def test_rotary_row_order_of_q_and_k_tensors():
    def reorder(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return rotary_rows_in_rotate_half_order(f"l.self_attn.{name}", tensor, 8, 4)  # heads of 8, 4 rotary dims

    rows = torch.arange(16.0)  # two heads
    order = [0, 2, 1, 3, 4, 5, 6, 7]  # per head: rotary rows even then odd, the rest as they are
    expected = torch.tensor(order + [8 + i for i in order], dtype=torch.float32)
    assert torch.equal(reorder("q_proj.weight", rows[:, None].expand(16, 3))[:, 0], expected)
    assert torch.equal(reorder("k_proj.bias", rows), expected)
    # Quantized tensors never come here (their checkpoints rotate at run time); one that did is refused.
    for other in ("qweight", "weight_scale"):
        with pytest.raises(UnsupportedModelError, match=f"q_proj.{other}"):
            reorder(f"q_proj.{other}", torch.zeros(16, 4))


def test_pre_quantized_checkpoints_rotate_interleaved_pairs_at_run_time():
    from octavo.models.glm import GlmForCausalLM, reorders_rotary_rows

    plain, quantized = arch("glm"), arch("glm", quantization_config={"quant_method": "awq", "bits": 4})
    options = GlmForCausalLM.decoder_options
    assert reorders_rotary_rows(plain) and not options(plain, torch.float32).rope_interleaved
    assert not reorders_rotary_rows(quantized) and options(quantized, torch.float32).rope_interleaved


@pytest.mark.usefixtures("one_thread")
def test_glm_rotated_at_run_time_matches_hf(family_dir, make_llm, monkeypatch):
    """The path of pre-quantized checkpoints (rows as stored, interleaved
    pairs rotated in plain torch), on the unquantized test checkpoint."""
    import octavo.models.glm as glm

    monkeypatch.setattr(glm, "reorders_rotary_rows", lambda config: False)
    path = family_dir("glm")
    llm = make_llm(path)
    rotary = llm.engine.executor.worker.runner.model.model.layers[0].self_attn.rotary_emb
    assert type(rotary).__name__ == "InterleavedRotaryEmbedding" and rotary.rotary_dim == 8
    matches_hf(llm, path)
