"""Image inputs without a model: decoding and its refusals, the features'
bytes through the IPC codec, and the prefix-cache keys they give blocks."""

from __future__ import annotations

import base64
import io

import pytest
import torch

from octavo.core.image_features import block_extra_keys, check_features, image_feature
from octavo.core.request import Request
from octavo.core.sampling_params import SamplingParams
from octavo.errors import InvalidArgumentError
from octavo.multimodal.image_loading import MAX_PIXELS, load_image
from octavo.multimodal.limits import images_per_prompt

Image = pytest.importorskip("PIL.Image")


def _png(width=6, height=4, color=(200, 10, 30), mode="RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color if mode == "RGB" else 128).save(buffer, format="PNG")
    return buffer.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_images_decode_from_data_urls_base64_and_pil_as_rgb():
    for source in (_data_url(_png()), base64.b64encode(_png()).decode(), Image.new("RGB", (6, 4))):
        image = load_image(source)
        assert image.mode == "RGB" and image.size == (6, 4)
    assert load_image(_data_url(_png(mode="L"))).mode == "RGB"  # grey scale converted


@pytest.mark.parametrize("source, message", [
    ("https://example.com/cat.png", "not fetched"),
    ("data:text/plain;base64,aGk=", "data:image/"),
    ("data:image/png;base64,@@@", "does not decode"),
    (_data_url(b"not an image at all"), "does not decode"),
    ("file:///etc/passwd", "allowed-local-media-path"),
    (12, "data URL or base64"),
])
def test_bad_images_are_refused_by_name(source, message):
    with pytest.raises(InvalidArgumentError, match=message):
        load_image(source)


def test_image_bombs_are_refused_before_their_pixels_are_decoded():
    side = int(MAX_PIXELS ** 0.5) + 16
    buffer = io.BytesIO()
    Image.new("1", (side, side)).save(buffer, format="PNG")  # a few KiB of file, 36M pixels
    with pytest.raises(InvalidArgumentError, match="more than"):
        load_image(_data_url(buffer.getvalue()))


def test_local_files_are_read_only_under_the_allowed_directory(tmp_path):
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "a.png").write_bytes(_png())
    (tmp_path / "b.png").write_bytes(_png())
    assert load_image(f"file://{tmp_path}/media/a.png", str(tmp_path / "media")).size == (6, 4)
    for outside in (f"file://{tmp_path}/b.png", f"file://{tmp_path}/media/../b.png"):
        with pytest.raises(InvalidArgumentError, match="under"):
            load_image(outside, str(tmp_path / "media"))


def test_features_survive_the_ipc_codec_bit_for_bit():
    from octavo.distributed.serialization import decode, encode

    pixels = torch.randn(3, 5, 7)
    feature = image_feature(pixels, offset=4, length=9)
    back = decode(encode([feature]))[0]
    assert back == feature and torch.equal(back.pixel_values(), pixels)
    assert image_feature(pixels.clone(), 4, 9).identifier == feature.identifier
    assert image_feature(pixels + 1e-3, 4, 9).identifier != feature.identifier


def test_feature_spans_must_lie_inside_the_prompt_in_order():
    a, b = image_feature(torch.zeros(2), 2, 3), image_feature(torch.ones(2), 4, 3)
    check_features([a], 5)
    with pytest.raises(InvalidArgumentError, match="past the prompt"):
        check_features([a], 4)
    with pytest.raises(InvalidArgumentError, match="disjoint"):
        check_features([a, b], 10)


def test_blocks_holding_an_image_are_keyed_by_it_and_only_those():
    red, blue = image_feature(torch.zeros(3), 5, 4), image_feature(torch.ones(3), 5, 4)  # positions 5..8
    prompt = list(range(100, 116))  # four blocks of 4
    hashes = {}
    for name, features in (("red", (red,)), ("blue", (blue,)), ("none", ())):
        request = Request("r", prompt, SamplingParams(), block_size=4, image_features=features)
        hashes[name] = request.block_hashes
    assert hashes["red"][0] == hashes["blue"][0] == hashes["none"][0]  # block 0 holds no image
    assert hashes["red"][1] != hashes["blue"][1] and hashes["red"][2] != hashes["blue"][2]
    assert hashes["red"][3] != hashes["blue"][3]  # chained on the blocks before
    assert block_extra_keys((red,), 9, 12) == b"" and block_extra_keys((red,), 8, 12) != b""


def test_image_limits_follow_vllms_flag():
    assert images_per_prompt(None, True) == 8 and images_per_prompt(None, False) == 0
    assert images_per_prompt({"image": 2}, True) == 2
    for bad, message in (({"video": 1}, "images only"), ({"image": -1}, ">= 0"), ("4", "JSON object"),
                         ({"image": 1}, "takes none")):
        with pytest.raises(InvalidArgumentError, match=message):
            images_per_prompt(bad, bad != {"image": 1})


def test_layouts_read_sizes_a_config_leaves_out_at_the_towers_defaults():
    # transformers saves only what differs from a config class's defaults: a layout must count
    # an image's rows with the tower's own defaults (CLIP 224/32, SigLIP 224/16, Pixtral patch 16),
    # as the tower that embeds it does, or the prompt's span and the image's rows disagree.
    from octavo.models.llava import llava_image_rows, llava_layout
    from octavo.models.mistral3 import merged_patch_size

    assert llava_image_rows({"vision_config": {}}) == 7 * 7  # + the class row, - the first row
    assert llava_image_rows({"vision_config": {"model_type": "siglip_vision_model"}}) == 14 * 14 - 1
    assert llava_image_rows({"vision_config": {}, "vision_feature_select_strategy": "full"}) == 7 * 7 + 1
    assert llava_layout({"vision_config": {"image_size": 336, "patch_size": 14}}, None).tokens_per_image == 576
    assert llava_layout({"vision_config": {}}, None).image_token_id == 32000  # LlavaConfig's, as the model's
    assert merged_patch_size({"vision_config": {}}) == 32 and merged_patch_size({"vision_config": {"patch_size": 14}}) == 28
