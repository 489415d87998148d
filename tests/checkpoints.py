"""Small random-weight checkpoints built with transformers, for tests.

Each architecture gets a distinct twist so that its special path is
exercised: Llama uses llama3 rope scaling and GQA, Mistral ties nothing and
has 1 KV head, Qwen2 ties embeddings (and has qkv bias), Qwen3 has an
explicit head_dim that differs from hidden/heads (and q/k norms).
"""

from __future__ import annotations

from pathlib import Path

import torch

from octavo.default_model import build_byte_bpe_tokenizer

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
    rms_norm_eps=1e-6,
)

ARCH_OVERRIDES = {
    "llama": dict(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    ),
    "mistral": dict(num_key_value_heads=1, sliding_window=None),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=32, tie_word_embeddings=False),
}

ARCHITECTURES = tuple(ARCH_OVERRIDES)

# The other families (tests/models/test_families.py), each with the options
# that make it differ from Llama set away from their defaults. MoE configs
# have 8 or 16 experts and route 2, 4 or 8 of them per token.
FAMILY_OVERRIDES = {
    "mixtral": ("MixtralConfig", dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             norm_topk_prob=False, decoder_sparse_step=2),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(num_experts=16, num_experts_per_tok=8, moe_intermediate_size=32, norm_topk_prob=True,
             mlp_only_layers=[0], head_dim=32),
    ),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=32, num_experts=8, num_experts_per_tok=8, clip_qkv=2.0)),
    "gemma2": (
        "Gemma2Config",
        dict(head_dim=32, query_pre_attn_scalar=24, attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
             sliding_window=8, tie_word_embeddings=True),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(head_dim=256, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}}),
    ),
    "phi3": (
        "Phi3Config",
        dict(max_position_embeddings=8192, original_max_position_embeddings=4096,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": [1.0 + i / 8 for i in range(8)], "long_factor": [4.0] * 8}),
    ),
    # Phi-4-mini: RoPE over 12 of each head's 16 dims (LongRoPE factors for those), tied embeddings.
    "phi4_mini": (
        "Phi3Config",
        dict(max_position_embeddings=8192, original_max_position_embeddings=4096, partial_rotary_factor=0.75,
             tie_word_embeddings=True,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": [1.0 + i / 6 for i in range(6)], "long_factor": [4.0] * 6}),
    ),
    # GLM: interleaved RoPE pairs over half of each head (HF's default 0.5), q/k/v biases;
    # GLM-4-0414 adds norms after attention and MLP, and a head_dim unlike hidden / heads.
    "glm": ("GlmConfig", dict(head_dim=16)),
    "glm4": ("Glm4Config", dict(head_dim=32)),
    "olmo2": ("Olmo2Config", dict()),
    "granite": (
        "GraniteConfig",
        dict(embedding_multiplier=12.0, attention_multiplier=0.0625, residual_multiplier=0.22, logits_scaling=8.0),
    ),
    "deepseek_v2": (
        "DeepseekV2Config",
        dict(kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
             num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             n_shared_experts=1, first_k_dense_replace=1, topk_method="group_limited_greedy", n_group=4, topk_group=2,
             routed_scaling_factor=1.5,
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024,
                              "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
             num_key_value_heads=4, n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
             n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True,
             routed_scaling_factor=2.5),
    ),
    # GLM-4.5: q/k norms, partial rotary (rotate-half), a dense first layer, grouped sigmoid routing, a shared expert.
    "glm4_moe": (
        "Glm4MoeConfig",
        dict(head_dim=32, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True, n_routed_experts=16,
             num_experts_per_tok=4, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
             n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5),
    ),
    # dots.llm1: q/k norms, biases on q/k/v/o, a sliding layer then a full one, GLM-4.5's routing.
    "dots1": (
        "Dots1Config",
        dict(head_dim=32, attention_bias=True, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
             n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, n_shared_experts=1,
             first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5),
    ),
    # EXAONE 4.0: post-norms, q/k norms, a sliding layer with RoPE then a global NoPE one.
    "exaone4": ("Exaone4Config", dict(head_dim=32, sliding_window=8, sliding_window_pattern=2,
                                      layer_types=["sliding_attention", "full_attention"])),
    # ERNIE 4.5 MoE: interleaved RoPE, biases, a dense first layer, a softmax router with a correction bias.
    "ernie4_5_moe": (
        "Ernie4_5_MoeConfig",
        dict(use_bias=True, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, moe_num_shared_experts=1,
             moe_layer_start_index=1, moe_layer_interval=1, tie_word_embeddings=False),
    ),
    # A sliding layer with plain RoPE, a full one with YaRN (RoPE per layer type).
    "olmo3": (
        "Olmo3Config",
        dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 1024}}),
    ),
    # q/k/v and MLP biases, none on o_proj; head_dim unlike hidden / heads.
    "seed_oss": ("SeedOssConfig", dict(head_dim=32, attention_bias=True, attention_out_bias=False, mlp_bias=True)),
    # Layer 0: RoPE and a sliding window; layer 1: NoPE, full attention.
    "smollm3": (
        "SmolLM3Config",
        dict(no_rope_layers=[1, 0], use_sliding_window=True, sliding_window=8,
             layer_types=["sliding_attention", "full_attention"]),
    ),
    # Interleaved RoPE pairs, biases on every projection, tied embeddings.
    "ernie4_5": ("Ernie4_5Config", dict(head_dim=32, use_bias=True, tie_word_embeddings=True)),
    # gpt-oss: a sliding layer (window 8) then a full one, attention sinks, biased
    # router and experts (all nonzero after build_checkpoint's re-init), YaRN
    # without truncation, and a SwiGLU limit low enough that the clamps bite.
    "gpt_oss": (
        "GptOssConfig",
        dict(head_dim=32, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=8,
             swiglu_limit=0.5, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                "original_max_position_embeddings": 128}),
    ),
    # Granite's multipliers around 8 fused experts, top-2; the shared variant adds a shared MLP.
    "granitemoe": (
        "GraniteMoeConfig",
        dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, embedding_multiplier=12.0,
             attention_multiplier=0.0625, residual_multiplier=0.22, logits_scaling=8.0),
    ),
    "granitemoe_shared": (
        "GraniteMoeSharedConfig",
        dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=4, shared_intermediate_size=48,
             embedding_multiplier=6.0, attention_multiplier=0.125, residual_multiplier=0.5, logits_scaling=4.0),
    ),
    # The LayerNorm families below get norm weights and biases away from 1 and 0 (``PERTURBED_NORMS``).
    # LayerNorms with biases, an ungated MLP, biases everywhere, a sliding window in every layer.
    "starcoder2": ("Starcoder2Config", dict(sliding_window=8, norm_epsilon=1e-2)),
    # Parallel attention and MLP, a LayerNorm per q/k head, interleaved RoPE, logits scaled.
    "cohere": ("CohereConfig", dict(use_qk_norm=True, layer_norm_eps=1e-2, logit_scale=0.3)),
    # Layer 0: sliding window with RoPE; layer 1: global, no RoPE.
    "cohere2": (
        "Cohere2Config",
        dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"], layer_norm_eps=1e-2,
             logit_scale=0.25),
    ),
}
FAMILIES = tuple(FAMILY_OVERRIDES)
# Families whose norms get random weights (and biases) too: with HF's init
# (weights 1, biases 0) a LayerNorm's bias and a per-head weight would go untested.
PERTURBED_NORMS = ("starcoder2", "cohere", "cohere2")


def _config_and_model(arch: str, vocab_size: int, **overrides):
    import transformers

    classes = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    }
    if arch in FAMILY_OVERRIDES:
        config_name, family = FAMILY_OVERRIDES[arch]
        settings = {k: v for k, v in dict(COMMON, vocab_size=vocab_size, **family, **overrides).items() if v is not None}
        config = getattr(transformers, config_name)(**settings)
        return transformers.AutoModelForCausalLM.from_config(config)
    config_name, model_name = classes[arch]
    settings = dict(COMMON, vocab_size=vocab_size, **ARCH_OVERRIDES[arch])
    settings.update(overrides)
    config = getattr(transformers, config_name)(**settings)
    return getattr(transformers, model_name)(config)


def build_checkpoint(out_dir: Path, arch: str, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """Save a random ``arch`` model plus the tokenizer from ``tokenizer_dir``."""
    import shutil

    from tokenizers import Tokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(seed)
    model = _config_and_model(arch, vocab_size, **overrides)
    # Larger weights than the default init make logits less flat, so that
    # greedy choices are not near-ties that float rounding could flip.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, 0.08)
            elif arch in PERTURBED_NORMS:
                param.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    model.save_pretrained(str(out_dir))
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, out_dir / file.name)
    return out_dir


def build_tokenizer(out_dir: Path) -> Path:
    build_byte_bpe_tokenizer(out_dir)
    return out_dir


# A Qwen-style (ChatML) template that renders tools the Hermes way, tool
# calls and tool results in the history, and Qwen3's enable_thinking switch.
TOOL_CHAT_TEMPLATE = r"""
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions. Function signatures are within <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Return each call as <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>
{%- elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{%- elif message.role == 'assistant' %}
<|im_start|>assistant
{% if message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{%- elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}
{%- endif %}
"""


def build_chat_checkpoint(out_dir: Path, tokenizer_dir: Path) -> Path:
    """A random Llama with a real tokenizer (``tokenizer_dir``) and ``TOOL_CHAT_TEMPLATE``."""
    import json

    build_checkpoint(out_dir, "llama", tokenizer_dir)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TOOL_CHAT_TEMPLATE.strip()
    config_path.write_text(json.dumps(config, indent=2))
    return out_dir
