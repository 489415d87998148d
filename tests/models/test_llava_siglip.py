"""LLaVA with a SigLIP vision tower (llava-interleave-qwen's kind) against
transformers, on small random checkpoints: the image embeddings equal
``get_image_features``'s (transformers drops the first row under "default"
for SigLIP too, though SigLIP has no class row); a text prompt through the
engine gives HF's greedy tokens."""

from __future__ import annotations

import pytest
import torch

from tests.hf_reference import hf_greedy
from tests.models.test_families import NUM_NEW_TOKENS, family_prompts, generate
from tests.models.test_hf_parity import check_against_hf
from tests.models.test_llava import IMAGE_TOKEN, TEXT, _hf_image_features, _octavo_model, llava_factory

pytestmark = pytest.mark.usefixtures("one_thread")

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=28,
              patch_size=14)
PATCHES = (28 // 14) ** 2


@pytest.fixture(scope="module")
def siglip_llava_dir(tmp_path_factory, tokenizer_dir):
    """``siglip_llava_dir(feature_layer, strategy)`` -> (checkpoint dir, the HF model), built on first use."""
    import transformers as t

    return llava_factory(tmp_path_factory, tokenizer_dir, lambda: t.SiglipVisionConfig(**VISION), (-1, "full"))


@pytest.mark.parametrize("feature_layer", [-1, -2])
@pytest.mark.parametrize("strategy", ["default", "full"])
def test_image_embeddings_match_hf(siglip_llava_dir, feature_layer, strategy):
    from octavo.models.siglip_vision import SiglipVisionTower

    path, hf = siglip_llava_dir(feature_layer, strategy)
    model = _octavo_model(path)
    assert isinstance(model.vision_tower, SiglipVisionTower)
    assert len(model.vision_tower.encoder.layers) == {-1: 2, -2: 1}[feature_layer]
    pixel_values = torch.randn(3, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.image_embeddings(pixel_values)
        expected = _hf_image_features(hf, pixel_values)
    # No class row: every patch under "full", one fewer under "default" (transformers drops the first row).
    assert model.tokens_per_image() == (PATCHES if strategy == "full" else PATCHES - 1)
    assert ours.shape == expected.shape == (3, model.tokens_per_image(), TEXT["hidden_size"])
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    assert model.largest_image() == (1, 3, 28, 28)


def test_text_prompts_match_hf(siglip_llava_dir, make_llm):
    path, _ = siglip_llava_dir()
    # No placeholder token in a prompt without an image.
    prompts = [[t if t != IMAGE_TOKEN else t + 1 for t in p] for p in family_prompts(path)]
    refs = [hf_greedy(path, p, NUM_NEW_TOKENS) for p in prompts]
    check_against_hf(generate(make_llm(path, platform="cpu"), prompts), refs)


@pytest.mark.parametrize("strategy", ["default", "full"])
def test_prompts_with_images_match_hf(siglip_llava_dir, make_llm, strategy):
    """Through the engine: the image token widened to the tower's rows (one patch fewer under
    "default", as transformers drops a first row SigLIP does not have), greedy tokens as HF's."""
    from PIL import Image
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from octavo import SamplingParams

    path, hf = siglip_llava_dir(-1, strategy)
    processor = SiglipImageProcessorPil(size={"height": 28, "width": 28})
    processor.save_pretrained(str(path))
    pixels = torch.randint(0, 256, (20, 40, 3), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    image = Image.fromarray(pixels.numpy())
    rows = PATCHES - (1 if strategy == "default" else 0)
    ids = [5, 6, IMAGE_TOKEN, 7, 8]
    widened = [5, 6] + [IMAGE_TOKEN] * rows + [7, 8]
    with torch.no_grad():
        expected = hf.generate(input_ids=torch.tensor([widened]), max_new_tokens=NUM_NEW_TOKENS, do_sample=False,
                               pixel_values=processor(images=[image], return_tensors="pt")["pixel_values"])
    llm = make_llm(path, platform="cpu")
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    output = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": image}}, params)[0]
    assert output.prompt_token_ids == widened
    assert list(output.outputs[0].token_ids) == expected[0, len(widened):].tolist()
