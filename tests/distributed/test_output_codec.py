"""The compact rows an engine process streams to its fronts, and a replica
serving several fronts (API processes) over its pipes."""

from __future__ import annotations

import multiprocessing
import threading

from octavo.core.kv_cache_manager import PrefixCacheStats
from octavo.core.outputs import RequestMetrics
from octavo.core.sampling_params import SamplingParams
from octavo.core.scheduler import SchedulerStats
from octavo.core.scheduler_output import EngineCoreOutput, TokenLogprobs
from octavo.distributed.dp_replica import ReplicaServer
from octavo.distributed.output_codec import output_request_id, pack_outputs, unpack_outputs
from octavo.distributed.serialization import decode, encode

def test_round_trip_of_core_outputs():
    logprobs = [TokenLogprobs([11, 3], [-0.5, -0.7], [1, 2])]
    full = EngineCoreOutput("a#1", [11], logprobs, [TokenLogprobs([6], [-2.0], [3])], "stop", "\n", 16, first_scheduled_time=12.5)
    plain = EngineCoreOutput("b", [4])
    other = RequestMetrics(arrival_time=3.0)  # anything else travels as itself
    rows = decode(encode(pack_outputs([full, plain, other])))
    assert [output_request_id(r) for r in rows[:2]] == ["a#1", "b"]
    assert unpack_outputs(rows) == [full, plain, other]


def test_a_pooled_vector_travels_in_its_row():
    """A pooling request's one output (``pooled`` bytes) reaches the front intact."""
    from octavo.core.pooling_params import PoolingParams
    from octavo.distributed.front_outputs import FrontOutputs

    vector = bytes(range(16))
    core = EngineCoreOutput("embd-1", [], finish_reason="stop", pooled=vector, first_scheduled_time=2.5)
    (back,) = unpack_outputs(decode(encode(pack_outputs([core]))))
    assert (back.pooled, back.first_scheduled_time, back.finish_reason) == (vector, 2.5, "stop")
    front = FrontOutputs(None)
    front.add("embd-1", "hi", [5, 6], PoolingParams())
    (output,), stopped = front.process(pack_outputs([core]))
    assert output.outputs.raw == vector and output.finished and stopped == []


def test_rows_are_small():
    outputs = [EngineCoreOutput(f"cmpl-{i:032x}", [1000 + i]) for i in range(256)]
    assert len(encode(["outputs", pack_outputs(outputs)])) < 256 * 64  # the id is most of it


class StubEngine:
    """Each step, one token for every live request; a request finishes after
    three, unless its id starts with "slow" (those run until aborted)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.aborted: list[str] = []
        self.shut_down = False

    def add_request(self, request_id, prompt, params, cache_salt=None, priority=0, lora_request=None) -> None:
        self.requests[request_id] = 0

    def children_of(self, request_id) -> list[str]:
        return [request_id] if request_id in self.requests else []

    def finish_children(self, child_ids, status) -> None:
        for child_id in child_ids:
            self.requests.pop(child_id, None)
            self.aborted.append(child_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[EngineCoreOutput]:
        outputs = []
        for request_id in list(self.requests):
            self.requests[request_id] += 1
            finished = self.requests[request_id] == 3 and not request_id.startswith("slow")
            outputs.append(EngineCoreOutput(request_id, [2], finish_reason="length" if finished else None))
            if finished:
                del self.requests[request_id]
        return outputs

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(len(self.requests), 0, 0.0, 8, 0, PrefixCacheStats())

    def shutdown(self) -> None:
        self.shut_down = True


def read_until_finished(conn, request_ids: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    while request_ids - {r for r, n in counts.items() if n < 0}:
        message = decode(conn.recv_bytes())
        assert message[0] == "outputs"
        for output in unpack_outputs(message[1]):
            counts[output.request_id] = counts.get(output.request_id, 0) + 1
            if output.finish_reason is not None:
                counts[output.request_id] = -counts[output.request_id]
    return counts


def test_a_replica_routes_outputs_to_the_front_that_added_the_request():
    (front_a, replica_a), (front_b, replica_b) = multiprocessing.Pipe(), multiprocessing.Pipe()
    engine = StubEngine()
    server = ReplicaServer(engine, [replica_a, replica_b])
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    params = SamplingParams()
    front_a.send_bytes(encode(["add", "a1", {"prompt_token_ids": [1]}, params, None, 0, None]))
    front_b.send_bytes(encode(["add", "b1", {"prompt_token_ids": [1]}, params, None, 0, None]))
    assert read_until_finished(front_a, {"a1"}) == {"a1": -3}
    assert read_until_finished(front_b, {"b1"}) == {"b1": -3}
    # Front A leaves with a request in flight: it is aborted; front B goes on.
    front_a.send_bytes(encode(["add", "slow-a2", {"prompt_token_ids": [1]}, params, None, 0, None]))
    assert decode(front_a.recv_bytes())[0] == "outputs"
    front_a.close()
    for _ in range(100):  # each answer comes after the replica handled what was queued before it
        front_b.send_bytes(encode(["stats"]))
        assert decode(front_b.recv_bytes())[0] == "stats"
        if engine.aborted:
            break
    assert engine.aborted == ["slow-a2"] and not engine.shut_down
    front_b.send_bytes(encode(["shutdown"]))
    assert decode(front_b.recv_bytes()) == ["bye"]
    thread.join(10)
    assert not thread.is_alive() and engine.shut_down
