"""Vision-language checkpoints served for text (Gemma 3, Mistral 3, Qwen2.5-VL, Qwen3-VL),
small random ones built with transformers: greedy token ids identical to
transformers' own multimodal model given text, chosen-token logprobs within
1e-4; the vision tower's tensors skipped; LoRA refused."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.hf_reference import hf_greedy
from tests.models.test_families import NUM_NEW_TOKENS, family_prompts, generate
from tests.models.test_hf_parity import check_against_hf

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, pad_token_id=2)


def _config(kind: str, vocab: int):
    import transformers as t

    if kind == "gemma3":
        text = t.Gemma3TextConfig(**TEXT, vocab_size=vocab, sliding_window=8,
                                  layer_types=["sliding_attention", "full_attention"])
        vision = t.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      image_size=28, patch_size=14)
        return t.Gemma3ForConditionalGeneration, t.Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=vocab - 1,
            boi_token_index=vocab - 3, eoi_token_index=vocab - 2)
    if kind == "mistral3":
        text = t.MistralConfig(**TEXT, vocab_size=vocab)
        vision = t.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                       image_size=28, patch_size=14, head_dim=16)
        return t.Mistral3ForConditionalGeneration, t.Mistral3Config(text_config=text, vision_config=vision,
                                                                     image_token_index=vocab - 1)
    if kind == "qwen3_vl_moe":
        text = dict(TEXT, vocab_size=vocab, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                    rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True,
                                     "rope_theta": 10000.0})
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0], num_position_embeddings=16)
        return t.Qwen3VLMoeForConditionalGeneration, t.Qwen3VLMoeConfig(text_config=text, vision_config=vision)
    if kind == "qwen3_vl":
        text = dict(TEXT, vocab_size=vocab, rope_parameters={
            "rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True, "rope_theta": 10000.0})
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0], num_position_embeddings=16)
        return t.Qwen3VLForConditionalGeneration, t.Qwen3VLConfig(text_config=text, vision_config=vision)
    text = dict(TEXT, vocab_size=vocab, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                         "rope_theta": 10000.0})
    text.pop("head_dim")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0])
    return t.Qwen2_5_VLForConditionalGeneration, t.Qwen2_5_VLConfig(text_config=text, vision_config=vision)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory, tokenizer_dir):
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    built = {}

    def get(kind: str):
        if kind not in built:
            model_class, config = _config(kind, vocab)
            torch.manual_seed(1)
            model = model_class(config)
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "norm" not in name:
                        param.normal_(0.0, 0.08)
            path = tmp_path_factory.mktemp(kind)
            model.save_pretrained(str(path))
            for file in tokenizer_dir.iterdir():
                shutil.copy(file, path / file.name)
            built[kind] = path
        return built[kind]

    return get


@pytest.mark.parametrize("kind", ["gemma3", "mistral3", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"])
def test_text_matches_the_multimodal_model(kind, vlm_dir, make_llm):
    path = vlm_dir(kind)
    prompts = family_prompts(path)
    refs = [hf_greedy(path, p, NUM_NEW_TOKENS) for p in prompts]
    llm = make_llm(path)
    check_against_hf(generate(llm, prompts), refs)
    small = make_llm(path, max_num_batched_tokens=7, num_kv_blocks=6, enable_prefix_caching=False)
    check_against_hf(generate(small, prompts), refs)


def test_lora_is_refused(vlm_dir):
    from octavo import LLM
    from octavo.errors import OctavoError

    with pytest.raises(OctavoError, match="LoRA adapters are not supported"):
        LLM(str(vlm_dir("mistral3")), enable_lora=True)


def test_qwen3_vl_moe_experts_as_qwen_released_them(vlm_dir, make_llm, tmp_path):
    """The same experts stacked as Qwen's checkpoints hold them (each transposed) give the same tokens."""
    from safetensors.torch import load_file, save_file

    path = vlm_dir("qwen3_vl_moe")
    released = tmp_path / "released"
    shutil.copytree(path, released)
    tensors = load_file(str(path / "model.safetensors"))
    tensors = {k: v.transpose(1, 2).contiguous() if k.endswith(("experts.gate_up_proj", "experts.down_proj")) else v
               for k, v in tensors.items()}
    save_file(tensors, str(released / "model.safetensors"))
    prompts = family_prompts(path)
    expected = [o.outputs[0].token_ids for o in generate(make_llm(path), prompts)]
    assert [o.outputs[0].token_ids for o in generate(make_llm(released), prompts)] == expected
