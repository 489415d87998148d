"""A worker killed mid-generation: the engine notices at once (process
sentinels, no collective timeout), fails every request in flight with
``EngineDeadError``, reports it from ``check_health`` (what /health turns
into a 503), stops the other workers and frees the KV cache."""

from __future__ import annotations

import os
import signal

import pytest

from octavo import LLM, SamplingParams
from octavo.errors import EngineDeadError
from tests.distributed.common import engine_options


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tp,pp,victim", [(2, 1, 1), (1, 2, 0)], ids=["tp2-kill-rank1", "pp2-kill-stage0"])
def test_killed_worker_fails_requests_and_health(llama_dir, tp, pp, victim):
    llm = LLM(str(llama_dir), **engine_options(tensor_parallel_size=tp, pipeline_parallel_size=pp))
    engine, executor = llm.engine, llm.engine.executor
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", list(range(5, 20 + i)), params)
    for _ in range(3):
        engine.step()
    engine.check_health()  # healthy so far
    dead_rank_pid = executor.worker_pids[victim]
    os.kill(dead_rank_pid, signal.SIGKILL)

    # Noticed through the process sentinel: no collective timeout is involved
    # (gloo's would take 10 minutes, past this test's time limit).
    with pytest.raises(EngineDeadError) as info:
        while engine.has_unfinished_requests():
            engine.step()
    assert f"worker rank {victim} (pid {dead_rank_pid}) died unexpectedly (exit code -9)" in str(info.value)
    assert info.value.http_status == 503
    assert sorted(info.value.failed_request_ids) == ["r0", "r1", "r2"]

    with pytest.raises(EngineDeadError, match="died unexpectedly"):
        engine.check_health()
    with pytest.raises(EngineDeadError):
        engine.add_request("late", [5, 6, 7], params)
    assert not engine.has_unfinished_requests()
    kv = engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks
    for worker in executor._workers:
        worker.process.join(5)
        assert not worker.process.is_alive()
    engine.shutdown()  # idempotent after the failure
