"""The protocol the engine uses to run the model; the runtime implements it.

The core never imports the runtime, a platform or a kernel: it hands a
``SchedulerOutput`` to an executor and gets a ``ModelRunnerOutput`` back.
An executor may run the model in this process, in worker processes or on
remote nodes; that is invisible here.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


@runtime_checkable
class Executor(Protocol):
    def determine_num_kv_blocks(self) -> int:
        """How many KV-cache blocks fit in the memory budget (after loading)."""

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache (and capture graphs, where the platform can)."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: compute the scheduled tokens and sample where due."""

    def check_health(self) -> None:
        """Raise if a worker is dead."""

    def shutdown(self) -> None:
        """Release workers and device memory; idempotent."""
