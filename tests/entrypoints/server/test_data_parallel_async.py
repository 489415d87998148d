"""The async engine's loop with an engine that behaves like a data-parallel one (no processes):
a command wakes a ``step()`` that waits for replica outputs, and an engine that dies while idle
stops the loop (``/health`` reads that) instead of going unnoticed until the next request."""

from __future__ import annotations

import asyncio
import threading

from octavo import SamplingParams
from octavo.core.kv_cache_manager import PrefixCacheStats
from octavo.core.scheduler import SchedulerStats
from octavo.entrypoints.async_engine import AsyncEngine
from octavo.errors import EngineDeadError

TIMEOUT_S = 60


class WaitingEngine:
    """``step()`` waits for outputs that never come, until ``wake()`` (or ``TIMEOUT_S``, a failure)."""

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.aborted: list[str] = []
        self.num_wakes = 0
        self.num_step_timeouts = 0
        self.dead: EngineDeadError | None = None
        self._woken = threading.Event()

    def wake(self) -> None:
        self.num_wakes += 1
        self._woken.set()

    def add_request(self, request_id, prompt, params, cache_salt=None, priority=0, lora_request=None) -> str:
        self.request_ids.append(request_id)
        return request_id

    def abort_request(self, request_ids) -> None:
        self.aborted += list(request_ids)

    def has_unfinished_requests(self) -> bool:
        return len(self.request_ids) > len(self.aborted)

    def step(self) -> list:
        if not self._woken.wait(TIMEOUT_S):
            self.num_step_timeouts += 1
        self._woken.clear()
        return []

    def tokenize_prompt(self, prompt):
        return None, prompt["prompt_token_ids"]

    def check_health(self) -> None:
        if self.dead is not None:
            raise self.dead

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(0, 0, 0.0, 0, 0, PrefixCacheStats())

    def shutdown(self) -> None:
        pass


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 2 * TIMEOUT_S))


def test_a_command_wakes_a_step_waiting_for_outputs():
    fake = WaitingEngine()
    prompt = {"prompt_token_ids": [5, 6, 7]}

    async def main():
        engine = AsyncEngine(fake)
        engine.start()
        first = await engine.add_request("a", prompt, SamplingParams(max_tokens=4))
        # The loop is now inside step(); the next add must not wait for that step to time out.
        second = await engine.add_request("b", prompt, SamplingParams(max_tokens=4))
        engine.close(first)
        engine.close(second)
        await engine.shutdown()

    run(main())
    assert fake.request_ids == ["a", "b"] and sorted(fake.aborted) == ["a", "b"]
    assert fake.num_wakes >= 2 and fake.num_step_timeouts == 0


def test_an_engine_that_dies_while_idle_stops_the_loop():
    fake = WaitingEngine()

    async def main():
        engine = AsyncEngine(fake)
        engine.start()
        assert engine.is_alive
        fake.dead = EngineDeadError("data-parallel replica 1 died (exit code -9)")
        while engine.is_alive:  # the idle loop asks check_health() every second
            await asyncio.sleep(0.05)
        error = engine.error
        try:
            await engine.add_request("late", {"prompt_token_ids": [5]}, SamplingParams(max_tokens=2))
        except EngineDeadError as exc:
            refused = exc
        await engine.shutdown()
        return error, refused

    error, refused = run(main())
    expected = "the engine loop failed: EngineDeadError: data-parallel replica 1 died (exit code -9)"
    assert error.message == expected and refused.message == expected
