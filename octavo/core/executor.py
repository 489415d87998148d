"""The protocol the engine uses to run the model; the runtime implements it.

The core never imports the runtime, a platform or a kernel: it hands a
``SchedulerOutput`` to an executor and gets a ``ModelRunnerOutput`` back.
An executor may run the model in this process, in worker processes or on
remote nodes; that is invisible here.

Pipelining: an executor with ``max_concurrent_batches > 1`` (pipeline
parallelism; or one device running an encoder's pooling steps, the next
launched while the host finishes the one before) accepts that many batches
before the first one's output is collected. ``execute_model(...,
non_block=True)`` then returns a ``PendingOutput`` at once; the engine calls
``result()`` on them in the order it submitted them. Executors that cannot
pipeline keep the default of 1 and are only ever called blocking. Optional
``even_batches_in_flight`` (default True): whether the scheduler shares the
requests evenly between the batches in flight (pipeline stages) or fills
each as it would a lone one.

Optional: ``attention_backend_names() -> list[str]``, the backends the
workers' layers use; the engine reports it (the server's configuration
panel) and reports nothing when an executor lacks it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


class PendingOutput(Protocol):
    def result(self) -> ModelRunnerOutput:
        """Wait for the batch's output; raise ``EngineDeadError`` if a worker died."""


@runtime_checkable
class Executor(Protocol):
    # How many batches may be in flight at once (1: execute_model blocks).
    max_concurrent_batches: int

    def determine_num_kv_blocks(self) -> int:
        """How many KV-cache blocks fit in the memory budget (after loading)."""

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache (and capture graphs, where the platform can)."""

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | PendingOutput:
        """Run one step: compute the scheduled tokens and sample where due.

        With ``non_block`` (only used when ``max_concurrent_batches > 1``),
        return a ``PendingOutput`` instead of waiting."""

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` if a worker is dead."""

    def shutdown(self) -> None:
        """Release workers and device memory; idempotent."""
