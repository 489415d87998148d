"""LLaVA-1.5 against transformers, on small random checkpoints (a CLIP tower,
a Llama language model): the image embeddings (tower, feature selection,
projector) equal ``get_image_features``'s; the language model given the
token rows with the image rows put in (``inputs_embeds``) gives HF's
logits for a prompt with an image; a text prompt through the engine gives
HF's greedy tokens; unsupported configs are refused by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from octavo.errors import ModelLoadError, OctavoError
from tests.hf_reference import hf_greedy
from tests.models.test_families import NUM_NEW_TOKENS, family_prompts, generate
from tests.models.test_hf_parity import check_against_hf

pytestmark = pytest.mark.usefixtures("one_thread")

IMAGE_TOKEN = 300
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, pad_token_id=2)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=28,
              patch_size=14)


def _hf_model(vocab: int, feature_layer: int, strategy: str, vision=None):
    """A random transformers LLaVA (``vision``: its tower's config, a CLIP one by default)."""
    import transformers as t

    config = t.LlavaConfig(
        text_config=t.LlamaConfig(**TEXT, vocab_size=vocab), vision_config=vision or t.CLIPVisionConfig(**VISION),
        image_token_index=IMAGE_TOKEN, vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy,
    )
    torch.manual_seed(1)
    model = t.LlavaForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # LayerNorms off their identity start, so that a misplaced one shows
                param.add_(torch.randn_like(param), alpha=0.1)
            else:
                param.normal_(0.0, 0.08)
    return model.eval()


def llava_factory(tmp_path_factory, tokenizer_dir, vision=None, defaults=(-2, "default")):
    """``get(feature_layer, strategy)`` -> (checkpoint dir, the HF model), each built on first use."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    built = {}

    def get(feature_layer: int = defaults[0], strategy: str = defaults[1]):
        key = (feature_layer, strategy)
        if key not in built:
            model = _hf_model(vocab, feature_layer, strategy, vision() if vision else None)
            path = tmp_path_factory.mktemp(f"llava{feature_layer}{strategy}")
            model.save_pretrained(str(path))
            for file in tokenizer_dir.iterdir():
                shutil.copy(file, path / file.name)
            built[key] = path, model
        return built[key]

    return get


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory, tokenizer_dir):
    """``llava_dir(feature_layer, strategy)`` -> (checkpoint dir, the HF model), built on first use."""
    return llava_factory(tmp_path_factory, tokenizer_dir)


def _octavo_model(path, raw: dict | None = None):
    """Octavo's LLaVA built from ``path`` (or ``raw`` config.json) in float32 on the CPU, weights loaded."""
    from octavo.models.base import ModelInitContext
    from octavo.models.config import load_arch_config, parse_arch_config
    from octavo.models.llava import LlavaForConditionalGeneration
    from octavo.models.loader import iterate_safetensors, safetensors_files
    from octavo.runtime.attention.torch_paged import TorchPagedAttention

    config = parse_arch_config(raw) if raw is not None else load_arch_config(path)
    ctx = ModelInitContext(config, torch.float32, None, TorchPagedAttention, 256, 16, torch.float32)
    model = LlavaForConditionalGeneration(ctx)
    if raw is None:
        model.load_weights(iterate_safetensors(safetensors_files(path)))
    return model.eval()


def _hf_image_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """transformers 5 returns an output whose ``pooler_output`` lists each image's projected rows."""
    # transformers 5.25 asks the tower for the feature layer's hidden states
    # only, and reads a feature layer of 0 as "none": ask for all of them then.
    everything = {"output_hidden_states": True} if model.config.vision_feature_layer == 0 else {}
    out = model.get_image_features(pixel_values=pixel_values, **everything)
    features = getattr(out, "pooler_output", out)
    return features if isinstance(features, torch.Tensor) else torch.stack(list(features))


@pytest.mark.parametrize("feature_layer,strategy", [(-2, "default"), (-1, "full"), (0, "default")])
def test_image_embeddings_match_hf(llava_dir, feature_layer, strategy):
    path, hf = llava_dir(feature_layer, strategy)
    model = _octavo_model(path)
    built = {-2: 2, -1: 3, 0: 0}[feature_layer]  # layers past the feature layer are never built
    assert len(model.vision_tower.encoder.layers) == built
    pixel_values = torch.randn(3, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.image_embeddings(pixel_values)
        expected = _hf_image_features(hf, pixel_values)
    assert model.tokens_per_image() == (5 if strategy == "full" else 4)
    assert ours.shape == expected.shape == (3, model.tokens_per_image(), TEXT["hidden_size"])
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)


def _prefill_logits(model, embeds: torch.Tensor) -> torch.Tensor:
    """The language model over one prompt given as embedding rows; the last row's logits."""
    from octavo.core.attention import AttentionBatch
    from octavo.models.layers.attention import Attention, ForwardContext

    tokens, block = embeds.shape[0], 16
    blocks = -(-tokens // block)
    batch = AttentionBatch(
        query_start_loc=torch.tensor([0, tokens], dtype=torch.int32),
        seq_lens=torch.tensor([tokens], dtype=torch.int32),
        block_table=torch.arange(blocks, dtype=torch.int32)[None], slot_mapping=torch.arange(tokens),
        num_reqs=1, num_actual_tokens=tokens, max_query_len=tokens, max_seq_len=tokens,
    )
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    backend = layers[0].backend
    caches = [torch.zeros(backend.kv_cache_shape(blocks)) for _ in layers]
    fctx = ForwardContext(backend.build_metadata(batch), caches)
    hidden = model(None, torch.arange(tokens), fctx, inputs_embeds=embeds)
    return model.compute_logits(hidden[-1:])[0]


def test_prompt_with_an_image_matches_hf(llava_dir):
    """Token rows with the image's rows in place of its placeholder tokens give HF's logits."""
    path, hf = llava_dir()
    model = _octavo_model(path)
    per_image = model.tokens_per_image()
    ids = torch.tensor([5, 17, *[IMAGE_TOKEN] * per_image, 40, 41, 99])
    pixel_values = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        embeds = model.embed_input_ids(ids)
        embeds[ids == model.image_token_id] = model.image_embeddings(pixel_values)[0]
        ours = _prefill_logits(model, embeds)
        expected = hf(input_ids=ids[None], pixel_values=pixel_values).logits[0, -1]
        text_only = _prefill_logits(model, model.embed_input_ids(ids))
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-4)
    assert not torch.allclose(text_only, expected, atol=1e-3)  # the image rows do matter


def test_text_prompts_match_hf(llava_dir, make_llm):
    path, _ = llava_dir()
    # No placeholder token in a prompt without an image.
    prompts = [[t if t != IMAGE_TOKEN else t + 1 for t in p] for p in family_prompts(path)]
    refs = [hf_greedy(path, p, NUM_NEW_TOKENS) for p in prompts]
    check_against_hf(generate(make_llm(path), prompts), refs)


def _released_name(name: str) -> str:
    """LLaVA-1.5's released names (llava-hf): the tower under ``vision_model.``."""
    return name.replace("vision_tower.", "vision_tower.vision_model.")


def _in_memory_name(name: str) -> str:
    """transformers 5's module names, unconverted: everything under ``model.`` but the head."""
    name = name.replace("language_model.model.", "language_model.").replace("language_model.lm_head.", "lm_head.")
    return name if name.startswith("lm_head.") else "model." + name


@pytest.mark.parametrize("rename", [_released_name, _in_memory_name])
def test_checkpoint_names(llava_dir, tmp_path, rename):
    """The same tensors under the names other saves use load to the same model; the
    released tower's ``position_ids`` buffer and the unused last layer are skipped."""
    from safetensors.torch import load_file, save_file

    path, _ = llava_dir()
    renamed = tmp_path / "renamed"
    shutil.copytree(path, renamed)
    tensors = {rename(k): v for k, v in load_file(str(path / "model.safetensors")).items()}
    tensors[rename("vision_tower.embeddings.position_ids")] = torch.arange(5)[None]
    save_file(tensors, str(renamed / "model.safetensors"))
    pixel_values = torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    ids = torch.arange(3, 60)
    with torch.no_grad():
        expected, theirs = _octavo_model(path), _octavo_model(renamed)
        assert torch.equal(theirs.image_embeddings(pixel_values), expected.image_embeddings(pixel_values))
        assert torch.equal(theirs.embed_input_ids(ids), expected.embed_input_ids(ids))
        assert torch.equal(theirs.lm_head.weight, expected.lm_head.weight)


def _edited(path, tmp_path, **multimodal) -> dict:
    raw = json.loads((path / "config.json").read_text())
    raw.update(multimodal)
    edited = tmp_path / "edited"
    shutil.copytree(path, edited)
    (edited / "config.json").write_text(json.dumps(raw))
    return raw


@pytest.mark.parametrize(
    "change,refusal",
    [
        (dict(vision_feature_layer=[-2, -1]), "vision_feature_layer .* not supported"),
        (dict(vision_config=dict(VISION, model_type="pixtral")), "'pixtral' vision tower"),
        (dict(vision_feature_select_strategy="cls"), "vision_feature_select_strategy 'cls'"),
        (dict(projector_hidden_act="swiglu"), "projector_hidden_act 'swiglu'"),
    ],
)
def test_unsupported_configs_are_refused(llava_dir, tmp_path, change, refusal):
    path, _ = llava_dir()
    raw = _edited(path, tmp_path, **change)
    with pytest.raises(ModelLoadError, match=refusal):
        _octavo_model(path, raw)


def test_unsupported_language_model_is_refused(llava_dir, tmp_path):
    path, _ = llava_dir()
    raw = json.loads((path / "config.json").read_text())
    raw["text_config"]["model_type"] = "gemma"
    with pytest.raises(ModelLoadError, match="'gemma' language model"):
        _octavo_model(path, raw)


def test_engine_refuses_a_list_of_feature_layers(llava_dir, tmp_path):
    from octavo import LLM

    path, _ = llava_dir()
    _edited(path, tmp_path, vision_feature_layer=[-2, -1])
    with pytest.raises(OctavoError, match="vision_feature_layer"):
        LLM(str(tmp_path / "edited"), dtype="float32", max_model_len=256)
