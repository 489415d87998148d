"""Outputs that wait for the event loop are merged; an idle loop takes each one."""

from __future__ import annotations

import asyncio

from octavo.core.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from octavo.entrypoints import fast_json
from octavo.entrypoints.output_queue import OutputQueue


def delta(index: int, text: str, token_ids: list[int], finish_reason=None, logprob=None) -> RequestOutput:
    logprobs = None if logprob is None else [{t: Logprob(logprob)} for t in token_ids]
    completion = CompletionOutput(index, text, token_ids, cumulative_logprob=logprob, logprobs=logprobs, finish_reason=finish_reason)
    metrics = RequestMetrics(arrival_time=0.0, num_generation_tokens=len(token_ids), sequence_index=index)
    return RequestOutput("r", "p", [1], [completion], finished=finish_reason is not None, metrics=metrics)


def test_waiting_deltas_merge_per_choice():
    queue = OutputQueue(delta=True)
    queue.put_nowait(delta(0, "Once", [5], logprob=-1.0))
    queue.put_nowait(delta(1, "A", [9], logprob=-0.5))
    queue.put_nowait(delta(0, " upon", [6], logprob=-2.0))
    queue.put_nowait(delta(0, " a", [7], finish_reason="length", logprob=-3.0))
    assert queue.qsize() == 1
    merged = queue.get_nowait()
    by_index = {c.index: c for c in merged.outputs}
    assert by_index[0].text == "Once upon a" and by_index[0].token_ids == [5, 6, 7]
    assert [list(p) for p in by_index[0].logprobs] == [[5], [6], [7]]
    assert by_index[0].finish_reason == "length" and by_index[0].cumulative_logprob == -3.0
    assert by_index[1].text == "A" and merged.finished


def test_cumulative_outputs_are_replaced_and_errors_never_merged():
    queue = OutputQueue(delta=False)
    queue.put_nowait(delta(0, "Once", [5]))
    queue.put_nowait(delta(0, "Once upon", [5, 6]))
    error = RuntimeError("engine died")
    queue.put_nowait(error)
    queue.put_nowait(delta(0, "late", [1]))
    assert queue.get_nowait().outputs[0].text == "Once upon"
    assert queue.get_nowait() is error
    assert queue.get_nowait().outputs[0].text == "late" and queue.empty()


def test_an_idle_consumer_gets_each_output_as_it_comes():
    async def main():
        queue = OutputQueue()
        getter = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        queue.put_nowait(delta(0, "a", [1]))
        first = await getter
        queue.put_nowait(delta(0, "b", [2]))
        return first, await queue.get()

    first, second = asyncio.run(main())
    assert first.outputs[0].text == "a" and second.outputs[0].text == "b"


def test_fast_json_matches_the_standard_library():
    import json

    payload = {"text": "héllo \"x\"\n", "ids": [1, 2], "lp": -0.125, "n": None, 3: True}
    assert json.loads(fast_json.dumps(payload)) == json.loads(json.dumps(payload))
    assert " " not in fast_json.dumps({"a": [1, 2]})
