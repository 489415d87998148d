"""The msgpack codec of worker and replica messages: round trips, and a
whitelist instead of pickle."""

from __future__ import annotations

import msgpack
import pytest

from octavo.core.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.core.scheduler_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    TokenLogprobs,
)
from octavo.distributed.serialization import decode, encode
from octavo.runtime.config import WorkerConfig


def test_scheduler_output_round_trip():
    params = SamplingParams(temperature=0.7, top_k=5, seed=3, stop=["x"], output_kind=RequestOutputKind.DELTA,
                            logit_bias={7: -100.0, 12: 2.5}, allowed_token_ids=[7, 12, 40])
    output = SchedulerOutput(
        new_requests=[NewRequestData("a", [1, 2, 3], [4], params, [0, 1], 16)],
        cached_requests=CachedRequestData(["b"], [[9]], [[7]], [33]),
        num_scheduled_tokens={"a": 3, "b": 1},
        finished_request_ids={"c", "d"},
        spec_token_ids={"b": [4, 4, 9]},
    )
    decoded = decode(encode(output))
    assert decoded == output
    assert isinstance(decoded.finished_request_ids, set)
    assert decoded.new_requests[0].sampling_params.output_kind is RequestOutputKind.DELTA
    assert list(decoded.new_requests[0].sampling_params.logit_bias) == [7, 12]  # int keys stay ints
    # The batch order is the dict order.
    assert list(decoded.num_scheduled_tokens) == ["a", "b"]


def test_runner_and_request_outputs_round_trip():
    runner_output = ModelRunnerOutput(
        sampled_token_ids={"a": [5], "b": []},
        logprobs={"a": [TokenLogprobs([5, 5, 6], [-0.1, -0.1, -2.5], [1, 1, 2])]},
        prompt_logprobs={"b": [TokenLogprobs([3], [-1.0], [4])]},
    )
    assert decode(encode(runner_output)) == runner_output
    request_output = RequestOutput(
        request_id="r",
        prompt=None,
        prompt_token_ids=[1, 2],
        outputs=[CompletionOutput(0, "hi", [5], -0.1, [{5: Logprob(-0.1, 1, "h")}], "length", None)],
        finished=True,
        prompt_logprobs=[None, {2: Logprob(-1.0, 3)}],
        metrics=RequestMetrics(arrival_time=1.5, num_generation_tokens=1),
    )
    decoded = decode(encode(request_output))
    assert decoded == request_output
    assert list(decoded.outputs[0].logprobs[0]) == [5]  # int keys stay ints


def test_worker_config_and_frozenset_round_trip():
    config = WorkerConfig("m", "dummy", "float32", "auto", 16, 128, 64, 8, "cpu", tensor_parallel_size=2)
    assert decode(encode([config, frozenset({1, 2}), (3, 4)])) == [config, frozenset({1, 2}), (3, 4)]


def test_unregistered_types_are_refused_both_ways():
    class Secret:
        pass

    with pytest.raises(TypeError, match="cannot send a Secret"):
        encode(Secret())
    forged = msgpack.packb(msgpack.ExtType(1, msgpack.packb(["os.system", {"command": "true"}])))
    with pytest.raises(ValueError, match="unregistered class 'os.system'"):
        decode(forged)


def test_invalid_sampling_params_are_revalidated_on_decode():
    payload = encode(SamplingParams())
    tampered = payload.replace(b"\xa5top_p\xcb?\xf0\x00\x00\x00\x00\x00\x00", b"\xa5top_p\xcb\x00\x00\x00\x00\x00\x00\x00\x00")
    assert tampered != payload
    with pytest.raises(ValueError, match="top_p"):
        decode(tampered)


def test_speculative_config_and_stats_round_trip():
    from octavo.core.kv_cache_manager import PrefixCacheStats
    from octavo.core.scheduler import SchedulerConfig, SchedulerStats
    from octavo.core.scheduler_config import SpecDecodingStats
    from octavo.core.speculative_config import SpeculativeConfig

    config = SchedulerConfig(speculative=SpeculativeConfig.from_dict({"num_speculative_tokens": 3, "prompt_lookup_min": 2}))
    assert decode(encode(config)) == config
    stats = SchedulerStats(1, 0, 0.5, 3, 0, PrefixCacheStats(), spec_decoding=SpecDecodingStats(4, 10, 6, [4, 2, 0]))
    assert decode(encode(stats)) == stats


def test_replicas_speculative_counters_add_up():
    from octavo.core.kv_cache_manager import PrefixCacheStats
    from octavo.core.scheduler import SchedulerStats
    from octavo.core.scheduler_config import SpecDecodingStats
    from octavo.distributed.replica_stats import ReplicaStats, combine_replica_stats

    def replica(index: int, spec: SpecDecodingStats | None) -> ReplicaStats:
        stats = SchedulerStats(1, 0, 0.5, 2, 0, PrefixCacheStats(), spec_decoding=spec)
        return ReplicaStats(index, stats, num_kv_blocks=4, num_requests_routed=1, num_requests_finished=0)

    combined = combine_replica_stats([replica(0, SpecDecodingStats(2, 6, 4, [2, 1, 1])), replica(1, SpecDecodingStats(1, 2, 1, [1, 0]))])
    assert combined.spec_decoding == SpecDecodingStats(3, 8, 5, [3, 1, 1])
    assert combine_replica_stats([replica(0, None)]).spec_decoding is None  # speculation off: no counters
