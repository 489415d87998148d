"""``ServerMetrics`` counts inter-token gaps once per token, whether the
outputs come from an engine in this process (one ``RequestMetrics`` object,
updated in place) or through msgpack from an engine process (a new object
each output)."""

from __future__ import annotations

import pytest

from octavo.core.outputs import CompletionOutput, RequestMetrics, RequestOutput
from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.distributed.serialization import decode, encode
from octavo.entrypoints.metrics import ServerMetrics

ITL = "octavo:inter_token_latency_seconds"


def streamed_outputs(num_tokens: int, n: int):
    """DELTA outputs of one request with ``n`` sequences, one token per step each."""
    metrics = [RequestMetrics(arrival_time=0.0, sequence_index=i) for i in range(n)]
    for step in range(num_tokens):
        for index, m in enumerate(metrics):
            m.first_token_time = m.first_token_time if m.first_token_time is not None else 1.0
            m.last_token_time = 1.0 + 0.01 * step
            m.num_generation_tokens = step + 1
            finished = step == num_tokens - 1
            completion = CompletionOutput(index, "x", [7], finish_reason="length" if finished else None)
            yield RequestOutput("r", None, [1, 2], [completion], finished and index == n - 1, metrics=m)


def sample(metrics: ServerMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


@pytest.mark.parametrize("through_msgpack", [False, True], ids=["same_process", "engine_process"])
@pytest.mark.parametrize("n", [1, 2])
def test_inter_token_gaps_counted_once(through_msgpack, n):
    metrics = ServerMetrics()
    params = SamplingParams(n=n, max_tokens=5, output_kind=RequestOutputKind.DELTA)
    metrics.on_request_added("r", 2, params)
    for output in streamed_outputs(5, n):
        if through_msgpack:
            output = decode(encode(output))
        metrics.on_outputs([output])
    assert sample(metrics, ITL + "_count") == 4 * n  # five tokens, four gaps, per sequence
    assert sample(metrics, ITL + "_sum") == pytest.approx(4 * n * 0.01)
    assert sample(metrics, "octavo:generation_tokens_total") == 5 * n
