"""Prompts with images through the engine, against transformers' LLaVA in
float32 on the same checkpoint: greedy tokens identical, with the image span
split across prompt chunks, with prefix caching (a different image never
hits another's blocks; the same image does), and refusals by name."""

from __future__ import annotations

import pytest
import torch

from octavo.core.sampling_params import SamplingParams
from octavo.errors import InvalidArgumentError
from tests.multimodal.llava_checkpoint import TOKENS_PER_IMAGE

Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.usefixtures("one_thread")
NEW_TOKENS = 8


def _image(seed: int):
    pixels = torch.randint(0, 256, (40, 64, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())  # not square: the processor resizes and crops it


def _hf_greedy(llava, token_ids: list[int], images: list) -> list[int]:
    """transformers' greedy continuation of ``token_ids`` (image tokens widened) with ``images``."""
    from transformers import AutoImageProcessor

    path, model, image_token = llava
    widened = [t for token in token_ids for t in ([token] * TOKENS_PER_IMAGE if token == image_token else [token])]
    inputs = {"input_ids": torch.tensor([widened])}
    if images:
        inputs["pixel_values"] = AutoImageProcessor.from_pretrained(str(path), backend="pil")(
            images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return out[0, len(widened):].tolist()


def _prompts(image_token: int) -> list[tuple[list[int], list]]:
    return [
        ([5, 17, image_token, 40, 41, 42], [_image(1)]),
        ([9, image_token, 30, image_token, 31, 32, 33], [_image(2), _image(3)]),
        ([image_token] + list(range(50, 70)), [_image(4)]),
    ]


def _generate(llm, prompts) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [{"prompt_token_ids": ids, "multi_modal_data": {"image": images}} for ids, images in prompts]
    return [list(o.outputs[0].token_ids) for o in llm.generate(requests, params)]


@pytest.fixture(scope="module")
def expected(llava):
    return [_hf_greedy(llava, ids, images) for ids, images in _prompts(llava[2])]


@pytest.mark.parametrize("options", [
    {},
    {"max_num_batched_tokens": 8, "enable_chunked_prefill": True},  # each image's 16 rows over several steps
    {"max_num_batched_tokens": 8, "async_scheduling": True},
    {"num_kv_blocks": 8, "block_size": 8, "max_num_seqs": 3},  # 16 blocks wanted, 8 held: preemptions
], ids=["whole", "chunked", "async", "preempted"])
def test_greedy_tokens_with_images_match_hf(llava, expected, make_llm, options):
    llm = make_llm(llava[0], platform="cpu", enable_prefix_caching=False, **options)
    assert _generate(llm, _prompts(llava[2])) == expected


def test_prefix_cache_tells_images_apart(llava, expected, make_llm):
    llm = make_llm(llava[0], platform="cpu", enable_prefix_caching=True, block_size=16)
    image_token = llava[2]
    prompt = [image_token] + list(range(50, 70))
    first = _generate(llm, [(prompt, [_image(4)])])
    other = _generate(llm, [(prompt, [_image(5)])])  # same ids, another picture: no block of the first may serve
    assert first == [expected[2]] and other == [_hf_greedy(llava, prompt, [_image(5)])]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    again = llm.generate({"prompt_token_ids": prompt, "multi_modal_data": {"image": _image(4)}}, params)[0]
    assert list(again.outputs[0].token_ids) == expected[2] and again.num_cached_tokens >= 16


def test_bad_image_prompts_are_refused_by_name(llava, llama_dir, make_llm):
    llm = make_llm(llava[0], platform="cpu", limit_mm_per_prompt={"image": 1})
    token = llava[2]
    params = SamplingParams(max_tokens=2)
    cases = [
        ({"prompt_token_ids": [3, token, token], "multi_modal_data": {"image": _image(1)}}, "2 image placeholders"),
        ({"prompt_token_ids": [3, token, token], "multi_modal_data": {"image": [_image(1)] * 2}}, "more than the 1"),
        ({"prompt_token_ids": [3, token], "multi_modal_data": {"video": _image(1)}}, "images only"),
        ({"prompt_token_ids": [3, token], "multi_modal_data": {"image": "https://x.org/a.png"}}, "not fetched"),
    ]
    for prompt, message in cases:
        with pytest.raises(InvalidArgumentError, match=message):
            llm.generate(prompt, params)
    with pytest.raises(InvalidArgumentError, match="neither be pooled nor truncated"):
        llm.generate({"prompt_token_ids": [3, token], "multi_modal_data": {"image": _image(1)}},
                     SamplingParams(max_tokens=2, truncate_prompt_tokens=3))
    text_llm = make_llm(llama_dir, platform="cpu")
    with pytest.raises(InvalidArgumentError, match="takes no images"):
        text_llm.generate({"prompt_token_ids": [3, 4], "multi_modal_data": {"image": _image(1)}}, params)
    assert llm.generate({"prompt_token_ids": [3, token], "multi_modal_data": {"image": _image(1)}}, params)


def test_a_text_prompt_naming_the_image_token_takes_the_image(llava, expected, make_llm):
    """``{"prompt": "...<image>...", "multi_modal_data": ...}``: the tokenizer's ``<image>`` is the placeholder."""
    llm = make_llm(llava[0], platform="cpu")
    tokenizer = llm.get_tokenizer()
    text = tokenizer.decode([5, 17]) + "<image>" + tokenizer.decode([40, 41, 42])
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(llava[2]) == 1
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    output = llm.generate({"prompt": text, "multi_modal_data": {"image": _image(1)}}, params)[0]
    assert list(output.outputs[0].token_ids) == _hf_greedy(llava, ids, [_image(1)])
    assert output.prompt == text and len(output.prompt_token_ids) == len(ids) - 1 + TOKENS_PER_IMAGE


def test_server_image_work_runs_apart_from_the_tokenizer_pool(llava):
    """While every image worker is busy, text still tokenises on the pool: a burst of
    large images cannot hold up other requests (``ImagePrompts.apply_async``)."""
    import asyncio
    import threading

    from octavo.entrypoints.openai.tokenizer_pool import TokenizerPool
    from octavo.models.llava import llava_layout
    from octavo.multimodal.processor import IMAGE_WORKERS, ImagePrompts

    prompts = ImagePrompts(llava[0], llava_layout({"vision_config": {"image_size": 56, "patch_size": 14},
                                                   "image_token_index": llava[2]}, None), max_images=2)
    release, names = threading.Event(), []
    process = prompts.processor

    def held(*args, **kwargs):
        names.append(threading.current_thread().name)
        assert release.wait(30)
        return process(*args, **kwargs)

    prompts.processor = held
    pool = TokenizerPool(None, num_workers=1)

    async def scenario():
        busy = [asyncio.ensure_future(prompts.apply_async([3, llava[2]], [_image(i)])) for i in range(IMAGE_WORKERS + 1)]
        text = await asyncio.wait_for(pool.run(lambda tokenizer, ids: list(ids), [1, 2, 3]), 10)
        release.set()
        return text, await asyncio.gather(*busy)

    text, done = asyncio.run(scenario())
    pool.shutdown()
    assert text == [1, 2, 3] and all(len(ids) == 1 + TOKENS_PER_IMAGE for ids, _ in done)
    assert names and all(name.startswith("octavo-images") for name in names)


def test_beam_search_keeps_the_prompts_images(llava, expected, make_llm):
    """Every beam extends its prompt, so each beam's request carries the prompt's images:
    a width-1 search is the greedy answer with the image, and beams differ by image."""
    from octavo.entrypoints.beam_search import BeamSearchParams

    llm = make_llm(llava[0], platform="cpu")
    ids, images = _prompts(llava[2])[0]
    params = BeamSearchParams(beam_width=1, max_tokens=NEW_TOKENS, ignore_eos=True)
    prompt = {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}
    best = llm.beam_search([prompt], params)[0].sequences[0]
    assert best.tokens[-NEW_TOKENS:] == expected[0]
    wide = llm.beam_search([prompt], BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True))[0]
    other = llm.beam_search([{**prompt, "multi_modal_data": {"image": _image(9)}}],
                            BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True))[0]
    assert [s.tokens for s in wide.sequences] != [s.tokens for s in other.sequences]


def test_the_memory_profile_embeds_the_largest_image(llava, make_llm):
    """The start-up profile that sizes the KV cache runs the vision tower on the largest
    image the processor sends, so its activations are not left out of the budget."""
    from octavo.platforms.profiling import profile_run

    runner = make_llm(llava[0], platform="cpu").engine.executor.worker.runner
    shapes, embed = [], runner.model.image_embeddings
    runner.model.image_embeddings = lambda pixels: shapes.append(tuple(pixels.shape)) or embed(pixels)
    profile_run(runner)
    assert shapes == [(1, 3, 56, 56)]
