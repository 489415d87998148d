"""gpt-oss's config as the released checkpoints write it, the experts'
layout and activation, and what is refused by name. (Outputs against
transformers: test_families.py's ``gpt_oss`` entry; MXFP4:
test_gpt_oss_mxfp4.py.)"""

from __future__ import annotations

import pytest
import torch

from octavo.errors import UnsupportedModelError
from octavo.models.config import parse_arch_config

# openai/gpt-oss-20b's config.json, with the sizes shrunk.
RELEASED = dict(
    architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=300, hidden_size=64, intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
    num_experts_per_tok=2, experts_per_token=2, sliding_window=128, attention_bias=True, swiglu_limit=7.0,
    layer_types=["sliding_attention", "full_attention"] * 2, rope_theta=150000,
    rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                  "rope_type": "yarn", "truncate": False},
    quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]},
)


def test_released_config():
    config = parse_arch_config(dict(RELEASED))
    assert config.sliding_windows == [128, None, 128, None]
    moe = config.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.renormalize) == (8, 2, 32, True)
    assert config.rope_theta == 150000 and config.rope_parameters["truncate"] is False
    assert config.attention_bias
    # MXFP4 experts are dequantized by the model while loading: no quantization method runs.
    assert config.quantization_config is None and config.raw["quantization_config"]["quant_method"] == "mxfp4"


def _build(raw: dict) -> None:
    from octavo.models.base import ModelInitContext
    from octavo.models.gpt_oss import GptOssForCausalLM
    from octavo.runtime.attention.torch_paged import TorchPagedAttention

    ctx = ModelInitContext(parse_arch_config(raw), torch.float32, None, TorchPagedAttention, 16, 16, torch.float32)
    with torch.device("meta"):
        GptOssForCausalLM(ctx)


@pytest.mark.parametrize(
    "fields,refusal",
    [
        (dict(quantization_config={"quant_method": "gptq"}), "quantized with 'gptq' are not supported"),
        (dict(rope_scaling={**RELEASED["rope_scaling"], "ntk_alpha": 2.0}), "YaRN option 'ntk_alpha'"),
    ],
)
def test_refused_by_name(fields, refusal):
    _build(dict(RELEASED))  # the released config builds
    with pytest.raises(UnsupportedModelError, match=refusal):
        _build(dict(RELEASED, **fields))


def test_experts_layout_and_activation():
    """HF's interleaved ``[E, hidden, 2 I]`` gate-up and ``[E, I, hidden]`` down
    against one expert computed as transformers' loop does it."""
    from octavo.models.layers.gpt_oss_moe import GptOssExperts, clamped_swiglu_experts

    moe = parse_arch_config(dict(RELEASED)).moe
    experts = GptOssExperts(moe, 64, torch.float32, False, "experts", alpha=1.702, limit=0.3)
    g = torch.Generator().manual_seed(0)
    gate_up, gate_up_bias = torch.randn(8, 64, 64, generator=g) * 0.1, torch.randn(8, 64, generator=g) * 0.1
    down, down_bias = torch.randn(8, 32, 64, generator=g) * 0.1, torch.randn(8, 64, generator=g) * 0.1
    experts.weight_loader(experts.w13_weight, gate_up, ("all", "gate_up"))
    experts.weight_loader(experts.w2_weight, down, ("all", "down"))
    experts.bias_loader(experts.w13_bias, gate_up_bias)
    experts.bias_loader(experts.w2_bias, down_bias)
    x = torch.randn(5, 64, generator=g)
    ids = torch.tensor([[3, 1], [1, 3], [0, 7], [7, 7], [2, 5]], dtype=torch.int32)
    weights = torch.rand(5, 2, generator=g)
    ours = experts(x, weights, ids)

    expected = torch.zeros_like(x)
    for token in range(5):
        for slot in range(2):
            e = int(ids[token, slot])
            h = x[token] @ gate_up[e] + gate_up_bias[e]
            gate, up = h[0::2].clamp(max=0.3), h[1::2].clamp(-0.3, 0.3)
            act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            expected[token] += weights[token, slot] * (act @ down[e] + down_bias[e])
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    # An expert held by another rank (-1) adds nothing.
    held = clamped_swiglu_experts(
        x, experts.w13_weight, experts.w13_bias, experts.w2_weight, experts.w2_bias, weights,
        torch.where(ids == 7, -1, ids), 1.702, 0.3,
    )
    assert torch.equal(held[3], torch.zeros(64))


def test_parameter_counts_match_hf(family_dir):
    from tests.models.test_family_config import test_parameter_counts_match_hf as counts_match

    counts_match("gpt_oss", family_dir)
