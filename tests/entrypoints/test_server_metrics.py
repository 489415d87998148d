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


def test_failures_the_server_causes_are_counted_and_logged_with_the_request_id(caplog):
    from octavo.entrypoints.engine_commands import RequestFailedError
    from octavo.entrypoints.failures import record_failure
    from octavo.errors import EngineDeadError, InvalidArgumentError, QueueFullError, RequestAbortedError

    metrics = ServerMetrics()
    not_failures = [InvalidArgumentError("bad"), QueueFullError("full"), RequestAbortedError("gone")]
    for exc in [*not_failures, EngineDeadError("the engine loop failed"), RequestFailedError("one request"),
                KeyError("bug")]:
        record_failure(metrics, f"cmpl-{type(exc).__name__}", exc)
    counted = {
        s.labels["reason"]: s.value for family in metrics.registry.collect() if family.name == "octavo:request_failures"
        for s in family.samples if s.name.endswith("_total")
    }
    # Client errors, refusals under load and disconnects are not failures.
    assert counted == {"engine_dead": 1.0, "request_failed": 1.0, "internal_error": 1.0}
    lines = [record.getMessage() for record in caplog.records]
    assert "request cmpl-EngineDeadError failed: engine_dead: the engine loop failed" in lines
    assert "request cmpl-KeyError failed: internal error" in lines
    assert next(r for r in caplog.records if "cmpl-KeyError" in r.getMessage()).exc_info is not None  # its traceback
    assert not any("InvalidArgument" in line or "QueueFull" in line or "RequestAborted" in line for line in lines)
