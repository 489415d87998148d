"""Executors: how the engine reaches its workers.

``UniProcExecutor`` runs the single worker in the engine's own process,
which is what one device needs.
"""

from __future__ import annotations

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.runtime.config import WorkerConfig
from octavo.runtime.worker import Worker


class UniProcExecutor:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.worker = Worker(config)
        self.worker.load_model()

    def determine_num_kv_blocks(self) -> int:
        return self.worker.determine_num_kv_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.worker.initialize_kv_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


def create_executor(config: WorkerConfig, backend: str | None = None):
    """The executor for ``config``: one process unless parallelism asks for more."""
    if config.tensor_parallel_size * config.pipeline_parallel_size == 1 and backend in (None, "uni"):
        return UniProcExecutor(config)
    from octavo.errors import InvalidArgumentError

    raise InvalidArgumentError(
        "tensor/pipeline parallelism needs a multiprocess executor, which this build does not have yet",
        param="tensor_parallel_size",
    )
