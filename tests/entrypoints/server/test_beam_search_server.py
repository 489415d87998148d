"""vLLM's ``use_beam_search`` on the OpenAI routes through the openai client:
the n choices are ``LLM.beam_search``'s n beams on the same prompt, best
first; what cannot be combined with a beam search is a 400 naming it."""

from __future__ import annotations

import httpx
import pytest

from octavo.entrypoints.beam_search import BeamSearchParams
from tests.entrypoints.server.conftest import API_KEY, MODEL_NAME

PROMPTS = ["Once upon a time", "The fox walked"]
MESSAGES = [{"role": "user", "content": "Where is the river?"}]
BEAM = {"use_beam_search": True}


def expected_beams(reference_llm, prompts, width: int, max_tokens: int, length_penalty: float = 1.0):
    return reference_llm.beam_search(prompts, BeamSearchParams(width, max_tokens, length_penalty=length_penalty))


def test_completions_choices_are_the_beams(openai_client, reference_llm):
    response = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS, max_tokens=5, n=3, extra_body={**BEAM, "length_penalty": 0.5}
    )
    expected = expected_beams(reference_llm, PROMPTS, 3, 5, 0.5)
    assert [c.index for c in response.choices] == list(range(6))
    assert [c.text for c in response.choices] == [beam.text for output in expected for beam in output.sequences]
    assert all(c.finish_reason in ("stop", "length") for c in response.choices)
    assert response.usage.completion_tokens == sum(len(b.output_token_ids) for o in expected for b in o.sequences)


def test_beam_logprobs_are_the_steps(openai_client, reference_llm):
    response = openai_client.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4, n=2, logprobs=3, extra_body=BEAM
    )
    (expected,) = expected_beams(reference_llm, PROMPTS[:1], 2, 4)
    for choice, beam in zip(response.choices, expected.sequences):
        assert sum(choice.logprobs.token_logprobs) == pytest.approx(beam.cum_logprob, abs=1e-4)
        assert all(len(top) >= 3 for top in choice.logprobs.top_logprobs)
    chat = openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=3, n=2, logprobs=True,
                                                 top_logprobs=4, extra_body=BEAM)
    assert all(len(entry.top_logprobs) == 4 for choice in chat.choices for entry in choice.logprobs.content)


def test_chat_choices_are_the_beams(openai_client, reference_llm):
    response = openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, n=2,
                                                     extra_body=BEAM)
    prompt = reference_llm.render_chat(MESSAGES)
    (expected,) = expected_beams(reference_llm, [prompt], 2, 4)
    assert [c.message.content for c in response.choices] == [beam.text for beam in expected.sequences]


@pytest.mark.parametrize(("fields", "param"), [
    ({"stream": True}, "stream"), ({"top_p": 0.5}, "top_p"), ({"logprobs": 5}, "logprobs"),
    ({"temperature": 0.5}, "temperature"), ({"n": 11}, "n"), ({"stop": ["x"]}, "stop"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"), ({"max_tokens": 5000}, "max_tokens"),
])
def test_what_cannot_be_combined_is_a_400(server, fields, param):
    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2, **BEAM, **fields}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_a_client_that_leaves_stops_the_search(server, auth_headers):
    from tests.entrypoints.server.conftest import read_metrics, wait_for

    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1500, "n": 4, "ignore_eos": True, **BEAM}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/completions", json=body, headers=auth_headers, timeout=1.0)
    wait_for(lambda: read_metrics(server, auth_headers)["octavo:num_inflight_sequences"] == 0)
    metrics = read_metrics(server, auth_headers)
    assert metrics["octavo:kv_cache_free_blocks"] == metrics["octavo:kv_cache_total_blocks"]
    # No step comes after: between two steps nothing is in flight either, so look again a moment later.
    import time

    time.sleep(0.5)
    later = read_metrics(server, auth_headers)
    assert later["octavo:prompt_tokens_total"] == metrics["octavo:prompt_tokens_total"]
