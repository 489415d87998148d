"""The Responses API (``/v1/responses``) through the openai client on a real
``octavo serve``: greedy answers equal ``LLM.chat`` on the same conversation
(instructions, a previous response's history, function-call items), streamed
and whole answers agree, stored responses are retrieved, listed, continued
and deleted, and what the route does not support is a 400 naming the field."""

from __future__ import annotations

import httpx
import openai
import pytest

from octavo import SamplingParams
from tests.entrypoints.server.conftest import API_KEY, MODEL_NAME

INSTRUCTIONS = "You are a fox."
QUESTION = "Where is the river?"
NUM_TOKENS = 12


def greedy_chat(reference_llm, messages: list[dict], num_tokens: int = NUM_TOKENS, **overrides):
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, **overrides)
    return reference_llm.chat(messages, params)[0].outputs[0]


def create(client, **kwargs):
    kwargs.setdefault("max_output_tokens", NUM_TOKENS)
    kwargs.setdefault("temperature", 0)
    return client.responses.create(model=MODEL_NAME, **kwargs)


def test_text_answer_equals_llm_chat(openai_client, reference_llm):
    expected = greedy_chat(reference_llm, [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}])
    response = create(openai_client, input=QUESTION, instructions=INSTRUCTIONS)
    assert response.output_text == expected.text
    assert response.id.startswith("resp_") and response.object == "response" and response.model == MODEL_NAME
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert response.usage.output_tokens == len(expected.token_ids)
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.temperature == 0 and response.instructions == INSTRUCTIONS
    if expected.finish_reason == "length":
        assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
        assert message.status == "incomplete"
    else:
        assert response.status == "completed" and response.incomplete_details is None


def test_stream_builds_the_whole_answer(openai_client):
    whole = create(openai_client, input=QUESTION, store=False)
    with openai_client.responses.stream(
        model=MODEL_NAME, input=QUESTION, max_output_tokens=NUM_TOKENS, temperature=0, store=False
    ) as stream:
        events = list(stream)
    # The tiny model runs to the token limit: the stream ends with response.incomplete, which the
    # client's get_final_response() does not take (it wants response.completed); the event holds it.
    final = events[-1].response
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert types[-1] == f"response.{whole.status}"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text == final.output_text
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens and final.status == whole.status


def test_input_items_and_function_call_history_render_as_chat(openai_client, reference_llm):
    call_args = '{"city": "Paris"}'
    items = [
        {"role": "developer", "content": INSTRUCTIONS},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
        {"type": "function_call", "call_id": "call_1", "name": "find_river", "arguments": call_args},
        {"type": "function_call_output", "call_id": "call_1", "output": "By the hill."},
    ]
    messages = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "find_river", "arguments": call_args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "By the hill."},
    ]
    expected = greedy_chat(reference_llm, messages)
    assert create(openai_client, input=items).output_text == expected.text


def test_previous_response_id_continues_and_the_store_keeps_it(openai_client, reference_llm):
    first = create(openai_client, input=QUESTION, instructions=INSTRUCTIONS)
    assert first.store is True
    second = create(openai_client, input="And then?", previous_response_id=first.id)
    # Instructions are not carried over (as OpenAI's): the history is the first input and output.
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "And then?"}]
    assert second.output_text == greedy_chat(reference_llm, history).text
    assert second.previous_response_id == first.id
    assert openai_client.responses.retrieve(first.id).output_text == first.output_text
    listed = openai_client.responses.input_items.list(second.id, order="asc")
    assert [(item.type, item.role) for item in listed.data] == [("message", "user")]
    assert listed.data[0].content[0].text == "And then?" and listed.data[0].id.startswith("msg_")
    openai_client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.responses.retrieve(first.id)
    assert caught.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError) as caught:  # the chain is broken
        create(openai_client, input="Still there?", previous_response_id=second.id)
    assert caught.value.body["param"] == "previous_response_id"


def test_the_store_shows_in_the_metrics(server, openai_client, auth_headers):
    from tests.entrypoints.server.conftest import read_metrics

    create(openai_client, input=QUESTION)
    metrics = read_metrics(server, auth_headers)
    assert metrics["octavo:responses_stored"] >= 1 and metrics["octavo:responses_stored_bytes"] > 1000
    assert metrics["octavo:responses_background_running"] >= 0


def test_store_false_is_not_kept(openai_client):
    response = create(openai_client, input=QUESTION, store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(response.id)


def test_logprobs_ride_on_the_output_text(openai_client, reference_llm):
    expected = greedy_chat(reference_llm, [{"role": "user", "content": QUESTION}], logprobs=2)
    response = create(openai_client, input=QUESTION, include=["message.output_text.logprobs"], top_logprobs=2)
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == len(expected.token_ids)
    for got, entry, token_id in zip(logprobs, expected.logprobs, expected.token_ids):
        assert got.logprob == pytest.approx(entry[token_id].logprob, abs=1e-4)
        assert len(got.top_logprobs) == 2


UNSUPPORTED = [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tool_choice": {"type": "allowed_tools", "tools": []}, "tools": [{"type": "function", "name": "f"}]}, "tool_choice"),
    ({"include": ["file_search_call.results"]}, "include.0"),
    ({"background": True, "store": False}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "verbose"}}, "reasoning.summary"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input.0.content.0"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input.0.arguments"),
    ({"input": []}, "input"),
    ({"max_tool_calls": 0}, "max_tool_calls"),
    ({"top_logprobs": 100}, "top_logprobs"),
    ({"max_output_tokens": 5000}, "max_output_tokens"),
    ({"not_a_field": 1}, "not_a_field"),
]


@pytest.mark.parametrize(("fields", "param"), UNSUPPORTED, ids=[p for _, p in UNSUPPORTED])
def test_what_is_not_supported_is_a_400_naming_it(server, fields, param):
    body = {"model": MODEL_NAME, "input": QUESTION, "max_output_tokens": 2, **fields}
    response = httpx.post(f"{server.url}/v1/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_an_input_too_long_names_input(server):
    body = {"model": MODEL_NAME, "input": "once upon a time " * 1000}
    response = httpx.post(f"{server.url}/v1/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "input", response.text


def test_unknown_ids_are_404s(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        for method, path in [("GET", "/v1/responses/resp_nope"), ("DELETE", "/v1/responses/resp_nope"),
                             ("GET", "/v1/responses/resp_nope/input_items")]:
            response = client.request(method, path)
            assert response.status_code == 404 and response.json()["error"]["code"] == "response_not_found"
        body = {"model": MODEL_NAME, "input": "hi", "previous_response_id": "resp_nope"}
        assert client.post("/v1/responses", json=body).json()["error"]["param"] == "previous_response_id"


def poll(client, response_id: str):
    import time

    deadline = time.monotonic() + 120
    while True:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_background_response_is_polled_to_the_answer(openai_client):
    whole = create(openai_client, input=QUESTION, store=False)
    queued = create(openai_client, input=QUESTION, background=True)
    assert queued.background and queued.status == "queued" and queued.output == []
    done = poll(openai_client, queued.id)
    assert done.status == whole.status and done.output_text == whole.output_text
    assert done.usage.output_tokens == whole.usage.output_tokens
    with pytest.raises(openai.BadRequestError):  # finished: nothing to cancel
        openai_client.responses.cancel(queued.id)


def test_background_response_cancelled(openai_client):
    long = create(openai_client, input=QUESTION, background=True, max_output_tokens=1900)
    cancelled = openai_client.responses.cancel(long.id)
    assert cancelled.status == "cancelled" and cancelled.id == long.id
    assert openai_client.responses.retrieve(long.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # not a background response
        openai_client.responses.cancel(create(openai_client, input=QUESTION).id)


def sse_events(lines) -> list[dict]:
    import json

    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


def test_a_streamed_background_response_is_resumed_after_a_disconnect(server, auth_headers, openai_client):
    body = {"model": MODEL_NAME, "input": QUESTION, "max_output_tokens": 1500, "background": True, "stream": True,
            "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=server.url, headers=auth_headers, timeout=120) as client:
        with client.stream("POST", "/v1/responses", json=body) as response:
            lines = response.iter_lines()
            first = []
            for line in lines:
                first += sse_events([line])
                if len(first) == 6:
                    break  # the client leaves; the run goes on
        response_id = first[0]["response"]["id"]
        after = first[-1]["sequence_number"]
        with client.stream("GET", f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": after}) as resumed:
            rest = sse_events(resumed.iter_lines())
    events = first + rest
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete" and final["status"] == "incomplete"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == final["output"][0]["content"][0]["text"] == openai_client.responses.retrieve(response_id).output_text
    assert openai_client.responses.retrieve(response_id).usage.output_tokens == 1500
    with pytest.raises(openai.BadRequestError):  # finished: nothing left to follow
        openai_client.responses.retrieve(response_id, stream=True)
