"""Executors: how the engine reaches its workers.

``create_executor`` picks one from ``distributed_executor_backend``:

- ``uni`` (default for one device): the worker runs in the engine's process.
- ``mp`` (default for ``tensor_parallel_size * pipeline_parallel_size > 1``):
  one spawned process per device on this host (``executors/multiproc.py``).
- ``ray``: one Ray actor per device, across nodes (``executors/ray_executor.py``).
- ``external_launcher``: under ``torchrun``, every process runs the engine
  and this executor drives its own rank (``executors/external_launcher.py``).
"""

from __future__ import annotations

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.errors import InvalidArgumentError
from octavo.runtime.config import WorkerConfig
from octavo.runtime.worker import Worker

BACKENDS = ("uni", "mp", "ray", "external_launcher")


class UniProcExecutor:
    max_concurrent_batches = 1

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        # The engine then launches each step before collecting the one before.
        self.async_scheduling = config.async_scheduling
        self.worker = Worker(config, local_rank=config.device_index_offset)
        self.worker.load_model()
        # An encoder's pooling steps: two in flight, the next launched while
        # the host finishes the one before (runtime/pooling_runner.py).
        self.max_concurrent_batches = 2 if self.worker.overlaps_pooling_steps() else 1
        self.even_batches_in_flight = False  # each step as without the overlap

    def determine_num_kv_blocks(self) -> int:
        return self.worker.determine_num_kv_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.worker.initialize_kv_cache(num_blocks)

    def attention_backend_names(self) -> list[str]:
        return self.worker.attention_backend_names()

    def lora_targets(self) -> dict[str, tuple[int, int]]:
        return self.worker.lora_targets()

    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False):
        if self.async_scheduling:
            pending = self.worker.execute_model_async(scheduler_output)
            return pending if non_block else pending.result()
        if non_block:  # only with max_concurrent_batches 2: pooling steps
            return self.worker.launch_pooling_step(scheduler_output)
        return self.worker.execute_model(scheduler_output)

    def reload_weights(self, weights_path: str | None) -> list[int]:
        return [self.worker.reload_weights(weights_path)]

    def load_weights(self, weights) -> list[int]:
        return [self.worker.load_weights(weights)]

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


def resolve_backend(backend: str | None, world_size: int) -> str:
    if backend is None:
        return "uni" if world_size == 1 else "mp"
    if backend not in BACKENDS:
        raise InvalidArgumentError(
            f"unknown distributed_executor_backend {backend!r} (one of {', '.join(BACKENDS)})",
            param="distributed_executor_backend",
        )
    if backend == "uni" and world_size > 1:
        raise InvalidArgumentError(
            f"distributed_executor_backend='uni' runs one device, but tensor_parallel_size * "
            f"pipeline_parallel_size is {world_size}; use mp, ray or external_launcher",
            param="distributed_executor_backend",
        )
    return backend


def create_executor(config: WorkerConfig, backend: str | None = None):
    """The executor for ``config``: one process unless parallelism or ``backend`` asks for more."""
    backend = resolve_backend(backend, config.tensor_parallel_size * config.pipeline_parallel_size)
    if backend == "uni":
        return UniProcExecutor(config)
    if backend == "mp":
        from octavo.runtime.executors.multiproc import MultiprocExecutor

        return MultiprocExecutor(config)
    if backend == "ray":
        from octavo.runtime.executors.ray_executor import RayExecutor

        return RayExecutor(config)
    from octavo.runtime.executors.external_launcher import ExternalLauncherExecutor

    return ExternalLauncherExecutor(config)
