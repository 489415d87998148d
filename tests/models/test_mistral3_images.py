"""Mistral 3 (Mistral Small 3.1 / 3.2) images against transformers, on a small random
checkpoint (a Pixtral tower, a Mistral language model): the image embeddings
(tower, projector with its patch merge) equal ``get_image_features``'s for
images of different sizes; the language model given the token rows with the
image rows put in gives HF's logits for a prompt with two images; the
placeholder layout is the processor's; a text prompt through the engine gives
HF's greedy tokens; unsupported configs are refused by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from octavo.errors import InvalidArgumentError, ModelLoadError
from tests.hf_reference import hf_greedy
from tests.models.test_families import NUM_NEW_TOKENS, family_prompts, generate
from tests.models.test_hf_parity import check_against_hf
from tests.models.test_llava import _in_memory_name, _prefill_logits

pytestmark = pytest.mark.usefixtures("one_thread")

IMAGE, BREAK, END = 300, 12, 13  # Mistral Small's [IMG] is 10, [IMG_BREAK] 12, [IMG_END] 13
TOKEN_IDS = {"image": IMAGE, "break": BREAK, "end": END}
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, pad_token_id=2)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=64,
              patch_size=8, hidden_act="silu")  # Mistral Small's tower uses silu (HF's default is gelu)
SIZES = [(32, 48), (64, 16)]  # (height, width) in pixels: 2x3 and 4x1 merged patches


def _pixels(height: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory, tokenizer_dir):
    """(checkpoint dir, the HF model): random weights, norms off their identity start."""
    import transformers as t
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    config = t.Mistral3Config(
        text_config=t.MistralConfig(**TEXT, vocab_size=vocab), vision_config=t.PixtralVisionConfig(**VISION),
        image_token_index=IMAGE, spatial_merge_size=2, tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    model = t.Mistral3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln_pre" in name:  # so that a misplaced norm shows
                param.add_(torch.randn_like(param), alpha=0.1)
            else:
                param.normal_(0.0, 0.1)
    path = tmp_path_factory.mktemp("mistral3")
    model.save_pretrained(str(path))
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, path / file.name)
    return path, model.eval()


def _octavo_model(path, raw: dict | None = None):
    """Octavo's Mistral 3 from ``path`` (config.json edited to ``raw`` if given), float32 on the CPU, loaded."""
    from octavo.models.base import ModelInitContext
    from octavo.models.config import load_arch_config, parse_arch_config
    from octavo.models.loader import iterate_safetensors, safetensors_files
    from octavo.models.mistral3 import Mistral3ForConditionalGeneration
    from octavo.runtime.attention.torch_paged import TorchPagedAttention

    config = parse_arch_config(raw) if raw is not None else load_arch_config(path)
    ctx = ModelInitContext(config, torch.float32, None, TorchPagedAttention, 256, 16, torch.float32)
    model = Mistral3ForConditionalGeneration(ctx)
    model.load_weights(iterate_safetensors(safetensors_files(path)))
    return model.eval()


def _hf_features(hf, pixel_values: torch.Tensor, sizes: list[tuple[int, int]], **options) -> list[torch.Tensor]:
    out = hf.get_image_features(pixel_values=pixel_values, image_sizes=torch.tensor(sizes), **options)
    return list(out.pooler_output)


def test_image_embeddings_match_hf(mistral3):
    path, hf = mistral3
    model = _octavo_model(path)
    for seed, (height, width) in enumerate(SIZES):
        pixel_values = _pixels(height, width, seed)
        with torch.no_grad():
            ours = model.image_embeddings(pixel_values)
            (expected,) = _hf_features(hf, pixel_values, [(height, width)])
        assert ours.shape == (1, (height // 16) * (width // 16), TEXT["hidden_size"])
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours[0], expected, rtol=0, atol=1e-5)


def test_an_earlier_feature_layer_matches_hf(mistral3):
    path, hf = mistral3
    raw = json.loads((path / "config.json").read_text())
    model = _octavo_model(path, dict(raw, vision_feature_layer=-2))
    assert len(model.vision_tower.transformer.layers) == 1  # layers past the feature layer are never built
    pixel_values = _pixels(32, 48, 5)
    with torch.no_grad():
        (expected,) = _hf_features(hf, pixel_values, [(32, 48)], vision_feature_layer=-2)
        torch.testing.assert_close(model.image_embeddings(pixel_values)[0], expected, rtol=0, atol=1e-5)


def test_pixel_sizes_off_the_patch_grid_are_refused(mistral3):
    model = _octavo_model(mistral3[0])
    with pytest.raises(InvalidArgumentError, match="multiples of 8"):
        model.image_embeddings(_pixels(30, 48, 0))


def test_prompt_with_images_matches_hf(mistral3):
    """Two images of different sizes in one prompt: HF takes them padded to one batch
    with their sizes; Octavo embeds each alone at its own size."""
    from octavo.models.mistral3 import mistral3_image_tokens

    path, hf = mistral3
    model = _octavo_model(path)
    raw = json.loads((path / "config.json").read_text())
    images = [_pixels(h, w, 10 + i) for i, (h, w) in enumerate(SIZES)]
    spans = [mistral3_image_tokens(raw, h, w, TOKEN_IDS) for h, w in SIZES]
    ids = torch.tensor([5, 17, *spans[0], 40, 41, *spans[1], 99, 7])
    batch = torch.zeros(2, 3, max(h for h, _ in SIZES), max(w for _, w in SIZES))
    for index, (h, w) in enumerate(SIZES):
        batch[index, :, :h, :w] = images[index][0]
    with torch.no_grad():
        embeds = model.embed_input_ids(ids)
        embeds[ids == model.image_token_id] = torch.cat([model.image_embeddings(p)[0] for p in images])
        ours = _prefill_logits(model, embeds)
        expected = hf(input_ids=ids[None], pixel_values=batch, image_sizes=torch.tensor(SIZES)).logits[0, -1]
        text_only = _prefill_logits(model, model.embed_input_ids(ids))
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-4)
    assert not torch.allclose(text_only, expected, atol=1e-3)  # the image rows do matter


def test_placeholder_layout(mistral3):
    """PixtralProcessor's layout (its module needs torchvision, absent here, so the
    rules are spelled out): per row of merged patches, an [IMG] per column then
    [IMG_BREAK]; the last [IMG_BREAK] is [IMG_END]; as many [IMG] as HF's features."""
    from octavo.models.mistral3 import mistral3_image_tokens

    path, hf = mistral3
    raw = json.loads((path / "config.json").read_text())
    I, B, E = IMAGE, BREAK, END
    assert mistral3_image_tokens(raw, 32, 48, TOKEN_IDS) == [I, I, I, B, I, I, I, E]
    assert mistral3_image_tokens(raw, 64, 16, TOKEN_IDS) == [I, B, I, B, I, B, I, E]
    assert mistral3_image_tokens(raw, 16, 16, TOKEN_IDS) == [I, E]
    for height, width in SIZES:
        tokens = mistral3_image_tokens(raw, height, width, TOKEN_IDS)
        (features,) = _hf_features(hf, _pixels(height, width, 0), [(height, width)])
        assert tokens.count(I) == features.shape[0]
        assert tokens.count(B) == height // 16 - 1 and tokens.count(E) == 1
    with pytest.raises(InvalidArgumentError, match="no whole merged patch"):
        mistral3_image_tokens(raw, 8, 64, TOKEN_IDS)


def test_text_prompts_match_hf(mistral3, make_llm):
    path, _ = mistral3
    prompts = [[t if t != IMAGE else t + 1 for t in p] for p in family_prompts(path)]  # no placeholder in text
    refs = [hf_greedy(path, p, NUM_NEW_TOKENS) for p in prompts]
    # No images allowed: the front end's image processing (octavo/multimodal) is not under test here.
    llm = make_llm(path, platform="cpu", limit_mm_per_prompt={"image": 0})
    check_against_hf(generate(llm, prompts), refs)


def test_checkpoint_names_in_memory(mistral3, tmp_path):
    """transformers 5's unconverted module names (``model.vision_tower.*``, ...) load the same model."""
    from safetensors.torch import load_file, save_file

    path, _ = mistral3
    renamed = tmp_path / "renamed"
    shutil.copytree(path, renamed)
    tensors = {_in_memory_name(k): v for k, v in load_file(str(path / "model.safetensors")).items()}
    assert any(k.startswith("model.vision_tower.") for k in tensors)
    save_file(tensors, str(renamed / "model.safetensors"))
    pixel_values = _pixels(32, 48, 3)
    with torch.no_grad():
        expected, theirs = _octavo_model(path), _octavo_model(renamed)
        assert torch.equal(theirs.image_embeddings(pixel_values), expected.image_embeddings(pixel_values))
        assert torch.equal(theirs.lm_head.weight, expected.lm_head.weight)


@pytest.mark.parametrize(
    "change,refusal",
    [
        (dict(vision_feature_layer=[-2, -1]), "vision_feature_layer .* not supported"),
        (dict(vision_config=dict(VISION, model_type="siglip_vision_model")), "'siglip_vision_model' vision tower"),
        (dict(projector_hidden_act="swiglu"), "projector_hidden_act 'swiglu'"),
    ],
)
def test_unsupported_configs_are_refused(mistral3, change, refusal):
    path, _ = mistral3
    raw = json.loads((path / "config.json").read_text())
    with pytest.raises(ModelLoadError, match=refusal):
        _octavo_model(path, dict(raw, **change))
