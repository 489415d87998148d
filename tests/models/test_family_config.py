"""Reading the families' configs: MoE settings under each family's names,
layer patterns that Hugging Face derives when ``config.json`` leaves them
out, options the layers lack refused at load naming the option, parameter
counts (total and active) for ``octavo env --model``, and dummy weights at
the benchmark configs' real structure with tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from octavo.errors import UnsupportedModelError
from octavo.models.config import parse_arch_config


BENCHMARK_CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "configs"
TINY = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300)


def config(**fields):
    raw = dict(architectures=["LlamaForCausalLM"], model_type="llama", **TINY)
    raw.update(fields)
    return raw


def test_moe_settings_per_family():
    mixtral = parse_arch_config(config(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2)).moe
    assert (mixtral.num_experts, mixtral.top_k, mixtral.intermediate_size, mixtral.renormalize) == (8, 2, 64, True)
    qwen = parse_arch_config(config(
        model_type="qwen2_moe", num_experts=60, num_experts_per_tok=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=128, num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3],
    )).moe
    assert qwen.sparse_layers == (False, True, False, False) and qwen.shared_expert_gate and not qwen.renormalize
    # transformers 5 saves Qwen3-MoE's num_experts as num_local_experts
    qwen3 = parse_arch_config(config(model_type="qwen3_moe", num_local_experts=16, num_experts_per_tok=8,
                                     moe_intermediate_size=32, norm_topk_prob=True)).moe
    assert (qwen3.num_experts, qwen3.renormalize) == (16, True)
    assert parse_arch_config(config()).moe is None


def test_sliding_layers_hf_derives():
    gemma2 = parse_arch_config(config(model_type="gemma2", sliding_window=8, num_hidden_layers=4))
    assert gemma2.sliding_windows == [8, None, 8, None]
    gemma3 = parse_arch_config(config(model_type="gemma3_text", sliding_window=8, num_hidden_layers=7,
                                      rope_theta=1e6, rope_local_base_freq=1e4))
    assert gemma3.sliding_windows == [8] * 5 + [None, 8]
    assert (gemma3.rope_theta, gemma3.local_rope_theta) == (1e6, 1e4)


def test_olmo3_layers_and_rope_per_layer_type():
    from transformers import Olmo3Config

    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}
    olmo3 = parse_arch_config(config(model_type="olmo3", sliding_window=8, num_hidden_layers=8, rope_theta=5e5,
                                     rope_scaling=yarn))
    hf_types = Olmo3Config(num_hidden_layers=8).layer_types
    assert olmo3.sliding_windows == [8 if kind == "sliding_attention" else None for kind in hf_types]
    # Older configs: the scaling is the full-attention layers'; the sliding ones keep plain RoPE.
    assert olmo3.rope_parameters["rope_type"] == "yarn"
    assert (olmo3.local_rope_theta, olmo3.local_rope_parameters) == (5e5, None)


def test_smollm3_nope_layers_and_windows_hf_derives():
    from transformers import SmolLM3Config

    from octavo.models.smollm3 import SmolLM3ForCausalLM

    hf = SmolLM3Config(num_hidden_layers=8, no_rope_layer_interval=3, use_sliding_window=True, sliding_window=8)
    ours = parse_arch_config(config(model_type="smollm3", num_hidden_layers=8, no_rope_layer_interval=3,
                                    use_sliding_window=True, sliding_window=8))
    assert ours.nope_layers == {i for i, uses_rope in enumerate(hf.no_rope_layers) if not uses_rope} == {2, 5}
    assert ours.sliding_windows == [8 if kind == "sliding_attention" else None for kind in hf.layer_types]
    default = parse_arch_config(config(model_type="smollm3", num_hidden_layers=8, sliding_window=8))
    assert default.nope_layers == {3, 7} and default.sliding_windows == [None] * 8  # HF: no window unless asked
    explicit = parse_arch_config(config(model_type="smollm3", num_hidden_layers=4, no_rope_layers=[1, 0, 0, 1]))
    assert explicit.nope_layers == {1, 2} and parse_arch_config(config()).nope_layers == frozenset()
    ambiguous = parse_arch_config(config(model_type="smollm3", sliding_window=8,
                                         layer_types=["sliding_attention", "full_attention"]))
    with pytest.raises(UnsupportedModelError, match="use_sliding_window"):
        SmolLM3ForCausalLM.decoder_options(ambiguous, torch.float32)


def test_ernie_use_bias_and_tied_embeddings_by_default():
    ernie = parse_arch_config(config(model_type="ernie4_5", use_bias=True))
    assert ernie.attention_bias and ernie.mlp_bias and ernie.tie_word_embeddings
    untied = parse_arch_config(config(model_type="ernie4_5", tie_word_embeddings=False))
    assert not (untied.attention_bias or untied.mlp_bias or untied.tie_word_embeddings)


def test_granitemoe_routing_and_shared_mlp():
    plain = parse_arch_config(config(model_type="granitemoe", num_local_experts=8, num_experts_per_tok=2)).moe
    # HF: the softmax of the top-k logits, i.e. the renormalised top-k of the softmax.
    assert (plain.num_experts, plain.top_k, plain.renormalize, plain.plain_routing) == (8, 2, True, True)
    assert plain.shared_expert_intermediate_size == 0 and plain.sparse_layers == (True, True)
    shared = parse_arch_config(config(model_type="granitemoeshared", num_local_experts=8, num_experts_per_tok=2,
                                      shared_intermediate_size=48)).moe
    assert (shared.shared_expert_intermediate_size, shared.shared_expert_gate) == (48, False)


def test_cohere2_global_layers_have_no_rope_hf_derives():
    from transformers import Cohere2Config

    hf_types = Cohere2Config(num_hidden_layers=8).layer_types  # every 4th layer global
    ours = parse_arch_config(config(model_type="cohere2", num_hidden_layers=8, sliding_window=8))
    assert ours.sliding_windows == [8 if kind == "sliding_attention" else None for kind in hf_types]
    assert ours.nope_layers == {i for i, kind in enumerate(hf_types) if kind == "full_attention"} == {3, 7}
    explicit = parse_arch_config(config(model_type="cohere2", sliding_window=8,
                                        layer_types=["full_attention", "sliding_attention"]))
    assert explicit.nope_layers == {0} and explicit.sliding_windows == [None, 8]
    # Without a window HF rotates in no layer at all.
    assert parse_arch_config(config(model_type="cohere2", sliding_window=None)).nope_layers == {0, 1}


@pytest.mark.parametrize("model_type", ["starcoder2", "cohere", "cohere2"])
def test_tied_embeddings_by_default(model_type):
    assert parse_arch_config(config(model_type=model_type)).tie_word_embeddings
    assert not parse_arch_config(config(model_type=model_type, tie_word_embeddings=False)).tie_word_embeddings


@pytest.mark.parametrize(
    "fields,option",
    [
        (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_type 'dynamic'"),
        (dict(hidden_act="relu"), "hidden_act 'relu'"),
        (dict(hidden_act="gelu_new"), "hidden_act 'gelu_new'"),
        # Partial rotary is supported; a factor that rotates no even number of dims is not.
        (dict(partial_rotary_factor=1.5), "partial_rotary_factor 1.5"),
        (dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.1}), "partial_rotary_factor 0.1"),
        (dict(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2, scoring_func="sigmoid"), "scoring_func 'sigmoid'"),
    ],
)
def test_unsupported_options_are_refused_by_name(fields, option):
    with pytest.raises(UnsupportedModelError, match=option):
        parse_arch_config(config(**fields))


def test_model_level_refusals():
    from octavo.models.base import ModelInitContext
    from octavo.models.gemma3 import Gemma3ForCausalLM
    from octavo.models.mixtral import MixtralForCausalLM
    from octavo.runtime.attention.torch_paged import TorchPagedAttention

    bidirectional = parse_arch_config(config(model_type="gemma3_text", use_bidirectional_attention=True))
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        Gemma3ForCausalLM.decoder_options(bidirectional, torch.float32)
    quantized = parse_arch_config(config(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2,
                                         quantization_config={"quant_method": "gptq"}))
    ctx = ModelInitContext(quantized, torch.float32, None, TorchPagedAttention, 16, 16, torch.float32)
    with pytest.raises(UnsupportedModelError, match="quantized with 'gptq' are not supported for mixture-of-experts"):
        with torch.device("meta"):
            MixtralForCausalLM(ctx)


def test_latent_attention_caches_one_latent_per_token(family_dir):
    """DeepSeek's cache: one 'KV head' of kv_lora_rank + qk_rope_head_dim per token and layer."""
    from octavo.quantization.memory import build_meta_model

    model, arch = build_meta_model(str(family_dir("deepseek_v2")), None, "float32")
    specs = {m.backend.spec for m in model.modules() if hasattr(m, "backend")}
    assert {(s.num_kv_heads, s.head_size, s.num_heads) for s in specs} == {(1, 32 + 8, 4)}
    assert arch.moe.sparse_layers == (False, True) and arch.moe.num_groups == 4


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "granitemoe_shared"])
def test_parameter_counts_match_hf(family, family_dir):
    from transformers import AutoModelForCausalLM

    from octavo.models.layers.attention import KV_SCALE_NAMES
    from octavo.quantization.memory import measure_weight_memory

    path = family_dir(family)
    memory = measure_weight_memory(str(path), None, "float32")
    hf = AutoModelForCausalLM.from_pretrained(str(path))
    # Each attention layer also holds its KV-cache scales (one number each, 1.0 unless an fp8 cache loads them).
    kv_scales = hf.config.num_hidden_layers * len(KV_SCALE_NAMES)
    assert memory.num_params == sum(p.numel() for p in hf.parameters()) + kv_scales
    moe = json.loads((path / "config.json").read_text())
    experts = moe.get("num_local_experts") or moe["num_experts"]
    expert_params = sum(p.numel() for n, p in hf.named_parameters() if ".experts." in n)
    inactive = expert_params - expert_params * moe["num_experts_per_tok"] // experts
    assert memory.num_active_params == memory.num_params - inactive
    assert "B active per token" in memory.describe(None)


def shrunk_config(name: str, out_dir: Path) -> Path:
    """A GPU-round config with tiny sizes; every other option kept."""
    raw = json.loads((BENCHMARK_CONFIGS / name / "config.json").read_text())
    raw.update(TINY, num_hidden_layers=3, max_position_embeddings=512)
    if raw.get("moe_intermediate_size"):
        raw.update(moe_intermediate_size=32, num_experts=16)
    if raw.get("sliding_window"):
        raw["sliding_window"] = 8
    out_dir.mkdir(exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(raw))
    return out_dir


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "gemma-2-9b"])
def test_benchmark_configs_load_with_dummy_weights(name, tmp_path, make_llm):
    from octavo import SamplingParams

    llm = make_llm(shrunk_config(name, tmp_path / name), load_format="dummy", skip_tokenizer_init=True, max_model_len=128)
    outputs = llm.generate([{"prompt_token_ids": [1, 2, 3, 4, 5] * 4}], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 4


@pytest.mark.usefixtures("one_thread")
def test_gpu_round_moe_bench_runs_on_tiny_shapes(tmp_path, capsys):
    """The GPU round's MoE step (``octavo bench latency --load-format dummy
    --compare-hf``) on the CPU, on the shrunk Mixtral config; its floor
    counts the experts a step routes to."""
    from octavo.entrypoints.cli.main import main

    model, out = shrunk_config("mixtral-8x7b", tmp_path / "mixtral"), tmp_path / "latency.json"
    argv = ["bench", "latency", "--model", str(model), "--load-format", "dummy", "--dtype", "float32",
            "--batch-size", "1", "--input-len", "8", "--output-len", "3", "--num-iters", "1", "--num-iters-warmup", "0",
            "--compare-hf", "--hf-mode", "eager", "--output-json", str(out)]
    assert main(argv) == 0
    assert "MoE: 2 of 8 experts per token" in capsys.readouterr().out
    result = json.loads(out.read_text())
    # Timings on a shared CPU are noise: only their presence is checked.
    assert {"ttft_s", "decode_s_per_token"} <= result["octavo"].keys() and result["hf"]["ttft_s"] > 0
