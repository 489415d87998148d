"""``octavo serve`` of a LLaVA checkpoint: a chat message with an ``image_url``
data URL (the openai SDK's shape) answers what the offline engine answers for
the same conversation; bad images are 400s with OpenAI's error object, and
the server keeps serving after them."""

from __future__ import annotations

import base64
import io
import json

import pytest

from octavo import SamplingParams
from tests.entrypoints.server.server_process import ServerProcess

Image = pytest.importorskip("PIL.Image")
API_KEY = "image-test-key"
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def llava_path(llava):
    return llava[0]


@pytest.fixture(scope="module")
def image_server(llava_path, tmp_path_factory):
    args = ["--max-model-len", "256", "--num-kv-blocks", "64", "--api-key", API_KEY, "--served-model-name", "llava",
            "--dtype", "float32", "--limit-mm-per-prompt", json.dumps({"image": 2})]
    with ServerProcess.running(llava_path, args, tmp_path_factory.mktemp("image-server") / "server.log") as process:
        yield process


def _data_url(seed: int) -> str:
    import torch

    pixels = torch.randint(0, 256, (30, 50, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _messages(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "what is in the picture?"}]}]


def test_chat_with_images_answers_as_the_offline_engine(image_server, llava_path):
    import openai

    from octavo import LLM

    llm = LLM(str(llava_path), dtype="float32", max_model_len=256, num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    conversations = [_messages(_data_url(1)), _messages(_data_url(2), _data_url(3))]
    expected = [list(o.outputs[0].token_ids) for o in llm.chat(conversations, params)]
    llm.engine.shutdown()
    assert expected[0] != expected[1]
    assert "images: up to 2 a prompt" in image_server.log()  # the startup line says what it takes
    client = openai.OpenAI(base_url=f"{image_server.url}/v1", api_key=API_KEY)
    for messages, tokens in zip(conversations, expected):
        answer = client.chat.completions.create(
            model="llava", messages=messages, max_tokens=NEW_TOKENS, temperature=0.0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        assert answer.choices[0].token_ids == tokens


@pytest.mark.parametrize("urls, message", [
    (["data:image/png;base64,%%%"], "does not decode"),
    (["https://example.com/a.png"], "not fetched"),
    (["data:image/png;base64," + base64.b64encode(b"GIF89a broken").decode()], "does not decode"),
    ([_data_url(1)] * 3, "more than the 2"),
])
def test_bad_images_are_400s_and_the_server_keeps_serving(image_server, urls, message):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "llava", "messages": _messages(*urls), "max_tokens": 2}
    response = httpx.post(f"{image_server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    ok = httpx.post(f"{image_server.url}/v1/chat/completions", headers=headers, timeout=60,
                    json={"model": "llava", "messages": _messages(_data_url(4)), "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_anthropic_image_blocks_answer_as_the_chat_route(image_server):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = _data_url(5)
    media_type, data = url[len("data:"):].split(";base64,")
    chat = httpx.post(f"{image_server.url}/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "llava", "messages": _messages(url), "max_tokens": NEW_TOKENS, "temperature": 0.0})
    block = {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    messages = [{"role": "user", "content": [block, {"type": "text", "text": "what is in the picture?"}]}]
    answer = httpx.post(f"{image_server.url}/v1/messages", headers=headers, timeout=60, json={
        "model": "llava", "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0.0})
    assert chat.status_code == answer.status_code == 200, answer.text
    assert answer.json()["content"][0]["text"] == chat.json()["choices"][0]["message"]["content"]
    # The same widened prompt: the image's 16 rows in both.
    assert answer.json()["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"] > 16
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%"}}
    refused = httpx.post(f"{image_server.url}/v1/messages", headers=headers, timeout=60, json={
        "model": "llava", "messages": [{"role": "user", "content": [bad]}], "max_tokens": 2})
    assert refused.status_code == 400 and "does not decode" in refused.text


def test_responses_input_images_answer_as_the_chat_route(image_server):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = _data_url(6)
    chat = httpx.post(f"{image_server.url}/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "llava", "messages": _messages(url), "max_tokens": NEW_TOKENS, "temperature": 0.0})
    content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "what is in the picture?"}]
    answer = httpx.post(f"{image_server.url}/v1/responses", headers=headers, timeout=60, json={
        "model": "llava", "input": [{"role": "user", "content": content}], "max_output_tokens": NEW_TOKENS,
        "temperature": 0.0, "store": False})
    assert chat.status_code == answer.status_code == 200, answer.text
    assert answer.json()["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"] > 16
    text = "".join(p["text"] for item in answer.json()["output"] for p in item.get("content", []) if "text" in p)
    assert text == chat.json()["choices"][0]["message"]["content"]


def test_beam_search_over_a_chat_with_an_image_keeps_the_image(image_server):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    messages = _messages(_data_url(7))
    greedy = httpx.post(f"{image_server.url}/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "llava", "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0.0})
    beam = httpx.post(f"{image_server.url}/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "llava", "messages": messages, "max_tokens": NEW_TOKENS, "use_beam_search": True, "n": 1})
    assert greedy.status_code == beam.status_code == 200, beam.text
    assert beam.json()["choices"][0]["message"]["content"] == greedy.json()["choices"][0]["message"]["content"]
