"""Mistral 3 (Pixtral tower) prompts with images through the engine against
transformers in float32: images of different shapes sized by the
checkpoint's processor, each ``[IMG]`` widened to rows of image tokens
closed by ``[IMG_BREAK]`` / ``[IMG_END]`` (only the image tokens take
embedding rows), whole and in prompt chunks that cut the rows."""

from __future__ import annotations

import shutil

import pytest
import torch

from octavo.core.sampling_params import SamplingParams
from tests.models.test_mistral3_images import TEXT, VISION

Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.usefixtures("one_thread")
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def pixtral(tmp_path_factory, tokenizer_dir):
    """(checkpoint dir, HF model, {"image", "break", "end"} ids, the image processor)."""
    import transformers as t
    from tokenizers import AddedToken, Tokenizer
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    path = tmp_path_factory.mktemp("pixtral-images")
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, path / file.name)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in ("[IMG]", "[IMG_BREAK]", "[IMG_END]")])
    tokenizer.save(str(path / "tokenizer.json"))
    ids = {name: tokenizer.token_to_id(token) for name, token in
           (("image", "[IMG]"), ("break", "[IMG_BREAK]"), ("end", "[IMG_END]"))}
    config = t.Mistral3Config(
        text_config=t.MistralConfig(**TEXT, vocab_size=tokenizer.get_vocab_size()),
        vision_config=t.PixtralVisionConfig(**VISION), image_token_index=ids["image"], spatial_merge_size=2,
    )
    torch.manual_seed(3)
    model = t.Mistral3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name and "ln_pre" not in name:
                param.normal_(0.0, 0.1)
    model.eval().save_pretrained(str(path))
    processor = PixtralImageProcessorPil(size={"longest_edge": 64}, patch_size=VISION["patch_size"])
    processor.save_pretrained(str(path))
    return path, model, ids, processor


def _image(seed: int, height: int, width: int):
    pixels = torch.randint(0, 256, (height, width, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def _hf_greedy(pixtral, token_ids: list[int], image) -> list[int]:
    from octavo.models.mistral3 import mistral3_image_tokens

    path, model, ids, processor = pixtral
    pixels = processor(images=[image], return_tensors="pt", patch_size=2 * VISION["patch_size"])["pixel_values"]
    height, width = pixels.shape[-2:]
    layout = mistral3_image_tokens(model.config.to_dict(), height, width, ids)
    widened = [t for token in token_ids for t in (layout if token == ids["image"] else [token])]
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([widened]), pixel_values=pixels,
                             image_sizes=torch.tensor([[height, width]]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(widened):].tolist()


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 8}], ids=["whole", "chunked"])
def test_pixtral_images_match_hf(pixtral, make_llm, options):
    image_id = pixtral[2]["image"]
    prompts = [([4, image_id, 20, 21], _image(1, 30, 90)), ([image_id, 7, 8, 9, 10], _image(2, 100, 40))]
    expected = [_hf_greedy(pixtral, ids, image) for ids, image in prompts]
    llm = make_llm(pixtral[0], platform="cpu", enable_prefix_caching=False, **options)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [{"prompt_token_ids": ids, "multi_modal_data": {"image": image}} for ids, image in prompts]
    outputs = llm.generate(requests, params)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    # 30x90 pixels fit in 64 (21x64), rounded up to whole 16-pixel merged patches (32x64): 2 rows of
    # 4 image tokens, each row closed by a break (the last by the end).
    assert outputs[0].prompt_token_ids[1:11] == ([image_id] * 4 + [pixtral[2]["break"]]) * 1 + [image_id] * 4 + [
        pixtral[2]["end"]]
