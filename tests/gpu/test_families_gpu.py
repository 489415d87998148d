"""On a CUDA GPU: the families with their own RoPE layouts (partial,
interleaved, none in some layers, a local RoPE per layer type) or their own
layers (LayerNorm, an ungated MLP, parallel attention and MLP, Granite's
fused experts; gpt-oss's attention sinks in the Triton kernels and its
plain-torch experts) through the Triton backend, with CUDA graphs and eagerly, against the CPU path in
float32: greedy tokens identical. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from octavo import SamplingParams
from tests.models.test_hf_parity import make_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FAMILIES = ["phi4_mini", "glm", "glm4", "olmo3", "seed_oss", "smollm3", "ernie4_5", "granitemoe_shared", "starcoder2",
            "cohere", "cohere2", "gpt_oss"]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_on_gpu_matches_the_cpu_path(family, family_dir, make_llm):
    from octavo.models.config import load_arch_config

    path = family_dir(family)
    prompts = [{"prompt_token_ids": p} for p in make_prompts(load_arch_config(path).vocab_size)[:6]]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    cpu = [o.outputs[0].token_ids for o in make_llm(path, platform="cpu").generate(prompts, params)]
    for options in ({}, {"enforce_eager": True}):
        gpu = make_llm(path, platform="cuda", **options).generate(prompts, params)
        assert [o.outputs[0].token_ids for o in gpu] == cpu, options
