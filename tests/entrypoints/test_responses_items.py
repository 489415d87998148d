"""The Responses API's pieces without a server: input items -> chat turns,
shaped deltas -> output items and events (streamed and whole agree), and the
bounded response store."""

from __future__ import annotations

import pytest

from octavo.entrypoints.openai.chat_output import ChoiceDelta
from octavo.entrypoints.openai.tool_parsers import ToolCallDelta
from octavo.entrypoints.responses_api.conversation import responses_conversation
from octavo.entrypoints.responses_api.output import ItemStream
from octavo.entrypoints.responses_api.store import ResponseNotFoundError, ResponseStore
from octavo.errors import InvalidArgumentError


def test_one_answer_of_items_is_one_assistant_turn():
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}], "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sun"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"role": "assistant", "content": "Sun and rain."},
        {"role": "assistant", "content": "Anything else?"},
    ]
    turns = responses_conversation("Be brief.", items)
    assert turns == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"a": 1}}},
            {"id": "c2", "type": "function", "function": {"name": "w", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sun"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "Sun and rain."},
        {"role": "assistant", "content": "Anything else?"},  # a second message is a second turn
    ]


@pytest.mark.parametrize(("item", "param"), [
    ({"role": "tool", "content": "x"}, "input.0.role"),
    ({"role": "critic", "content": "x"}, "input.0.role"),
    ({"type": "function_call_output", "output": "x"}, "input.0.call_id"),
    ({"type": "function_call", "name": "f"}, "input.0"),
    ({"type": "computer_call"}, "input.0.type"),
])
def test_bad_items_name_their_place(item, param):
    with pytest.raises(InvalidArgumentError) as caught:
        responses_conversation(None, [item])
    assert caught.value.param == param


def run_stream(deltas: list[ChoiceDelta], status: str = "completed", **options) -> tuple[list[dict], list[dict]]:
    stream = ItemStream(**options)
    events = []
    for delta in deltas:
        events += stream.events(delta, [{"token": "t", "logprob": -1.0}] if options.get("with_logprobs") else None)
    return events + stream.close(status), stream.items


def test_streamed_items_equal_the_whole_answer_and_events_nest():
    pieces = [
        ChoiceDelta(reasoning="let me "), ChoiceDelta(reasoning="see"), ChoiceDelta(content="It is "),
        ChoiceDelta(content="sunny."), ChoiceDelta(tool_calls=[ToolCallDelta(0, id="call_a", name="w", arguments="")]),
        ChoiceDelta(tool_calls=[ToolCallDelta(0, arguments='{"d"')]), ChoiceDelta(tool_calls=[ToolCallDelta(0, arguments=": 1}")]),
        ChoiceDelta(tool_calls=[ToolCallDelta(1, id="call_b", name="t", arguments="{}")]),
    ]
    events, items = run_stream(pieces)
    whole = ChoiceDelta()
    for piece in pieces:
        whole = whole.joined(piece)
    _, whole_items = run_stream([whole])
    strip = [{k: v for k, v in item.items() if k != "id"} for item in items]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in whole_items]
    assert [item["type"] for item in items] == ["reasoning", "message", "function_call", "function_call"]
    assert items[0]["content"][0]["text"] == "let me see" and items[2]["arguments"] == '{"d": 1}'
    assert all(item["status"] == "completed" for item in items)
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]
    # Each item's events sit between its added and done events.
    for event in events:
        if "item_id" in event:
            assert items[event["output_index"]]["id"] == event["item_id"]


def test_an_empty_answer_is_one_empty_message_and_the_cut_one_is_incomplete():
    events, items = run_stream([], status="incomplete")
    assert [(i["type"], i["content"][0]["text"], i["status"]) for i in items] == [("message", "", "incomplete")]
    assert events[-1]["item"]["status"] == "incomplete"


def test_max_tool_calls_drops_later_calls_and_logprobs_ride_on_text():
    calls = [ToolCallDelta(i, id=f"c{i}", name="f", arguments="{}") for i in range(3)]
    _, items = run_stream([ChoiceDelta(content="x", tool_calls=calls)], max_tool_calls=2, with_logprobs=True)
    assert [i["type"] for i in items] == ["message", "function_call", "function_call"]
    assert len(items[0]["content"][0]["logprobs"]) == 1


def response(response_id: str, previous: str | None = None, text: str = "out") -> dict:
    return {"id": response_id, "previous_response_id": previous, "output": [{"type": "message", "text": text}]}


def test_store_replays_a_chain_and_evicts_the_least_recently_used():
    store = ResponseStore(max_entries=3, max_bytes=1 << 20)
    store.put(response("r1"), [{"in": 1}])
    store.put(response("r2", "r1"), [{"in": 2}])
    assert store.history("r2") == [{"in": 1}, {"type": "message", "text": "out"}, {"in": 2}, {"type": "message", "text": "out"}]
    store.get("r1")  # r1 is now the most recently used
    store.put(response("r3"), [])
    store.put(response("r4"), [])  # evicts r2
    assert set(store.entries) == {"r1", "r3", "r4"}
    with pytest.raises(ResponseNotFoundError) as caught:
        store.history("r2")
    assert caught.value.param == "previous_response_id"


def test_store_bytes_bound_and_deletion():
    store = ResponseStore(max_entries=100, max_bytes=400)
    assert not store.put(response("big", text="x" * 1000), [])
    for index in range(10):
        store.put(response(f"r{index}"), [])
    assert store.num_bytes <= 400 and "r9" in store.entries and "r0" not in store.entries
    assert store.delete("r9") and not store.delete("r9")
    assert store.num_bytes == sum(entry.num_bytes for entry in store.entries.values())
    assert not ResponseStore(0, 0).put(response("r"), [])


def test_a_server_that_stores_nothing_refuses_what_needs_the_store():
    from octavo.entrypoints.responses_api.checks import wants_stored
    from octavo.entrypoints.responses_api.protocol import ResponsesRequest

    off = ResponseStore(0, 0, why_off="--max-stored-responses 0")
    assert not wants_stored(ResponsesRequest(input="hi"), off)  # the default: answered, not stored
    for fields, param in (({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id")):
        with pytest.raises(InvalidArgumentError) as caught:
            wants_stored(ResponsesRequest(input="hi", **fields), off)
        assert caught.value.param == param and "--max-stored-responses 0" in caught.value.message
    on = ResponseStore(4, 1 << 20)
    assert wants_stored(ResponsesRequest(input="hi"), on) and not wants_stored(ResponsesRequest(input="hi", store=False), on)


def test_a_chain_too_long_for_the_context_is_refused_before_it_is_assembled():
    from octavo.errors import PromptTooLongError

    store = ResponseStore(max_entries=10, max_bytes=1 << 20)
    store.put(response("r1", text="x" * 600), [{"content": "y" * 300}])
    store.put(response("r2", "r1", text="z" * 200), [])
    assert len(store.history("r2", max_chars=2000)) == 3
    with pytest.raises(PromptTooLongError) as caught:
        store.history("r2", max_chars=1000)
    assert caught.value.param == "previous_response_id"
