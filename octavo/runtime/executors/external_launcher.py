"""The external-launcher executor: every process is started by ``torchrun``
(or another launcher that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``) and runs the whole engine.

Invariants:
- Every process must receive the same requests in the same order (e.g. the
  same script calling ``LLM.generate`` with the same prompts): each runs its
  own scheduler, and the schedulers stay identical because every step's
  ``ModelRunnerOutput`` is broadcast from the output rank to all ranks. So
  every rank returns the same outputs; scripts usually print on rank 0 only.
- The broadcast carries msgpack bytes in a uint8 tensor over a gloo group
  (CPU tensors, whatever the compute backend), never a pickled object.
- One batch at a time (``max_concurrent_batches == 1``): each process's engine
  loop is synchronous, so pipeline stages take turns instead of overlapping.
- KV blocks: every rank allocates the minimum over ranks.
"""

from __future__ import annotations

import os

import torch

from octavo.core.scheduler_output import SchedulerOutput
from octavo.distributed.parallel_state import output_rank
from octavo.distributed.serialization import decode, encode
from octavo.errors import InvalidArgumentError
from octavo.runtime.config import WorkerConfig
from octavo.runtime.worker import RankInfo, Worker


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise InvalidArgumentError(
            f"distributed_executor_backend='external_launcher' expects {name} in the environment "
            "(run under torchrun)",
            param="distributed_executor_backend",
        )
    return int(value)


class ExternalLauncherExecutor:
    max_concurrent_batches = 1

    def __init__(self, config: WorkerConfig) -> None:
        import torch.distributed as dist

        rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
        expected = config.tensor_parallel_size * config.pipeline_parallel_size
        if world_size != expected:
            raise InvalidArgumentError(
                f"the launcher started {world_size} processes but tensor_parallel_size * pipeline_parallel_size "
                f"is {expected}",
                param="tensor_parallel_size",
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0")) + config.device_index_offset
        self.rank = rank
        self._output_rank = output_rank(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.worker = Worker(config, rank_info=RankInfo(rank, world_size, "env://", local_rank))
        # Control messages ride on gloo (CPU) even when the compute backend is nccl.
        self._control = dist.new_group(backend="gloo") if world_size > 1 else None
        self.worker.load_model()
        self._closed = False

    def determine_num_kv_blocks(self) -> int:
        num_blocks = torch.tensor([self.worker.determine_num_kv_blocks()], dtype=torch.int64)
        if self._control is not None:
            import torch.distributed as dist

            dist.all_reduce(num_blocks, op=dist.ReduceOp.MIN, group=self._control)
        return int(num_blocks.item())

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.worker.initialize_kv_cache(num_blocks)

    def reload_weights(self, weights_path: str | None) -> list[int]:
        return [self.worker.reload_weights(weights_path)]  # every process reloads its own rank

    def attention_backend_names(self) -> list[str]:
        return self.worker.attention_backend_names()  # this rank's (ranks agree unless stages differ)

    def lora_targets(self) -> dict[str, tuple[int, int]]:
        return self.worker.lora_targets()

    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False):
        output = self.worker.execute_model(scheduler_output)
        if self._control is None:
            return output
        payload = encode(output) if self.rank == self._output_rank else b""
        return decode(self._broadcast_bytes(payload))

    def _broadcast_bytes(self, payload: bytes) -> bytes:
        import torch.distributed as dist

        size = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(size, src=self._output_rank, group=self._control)
        buffer = torch.empty(int(size.item()), dtype=torch.uint8)
        if self.rank == self._output_rank:
            buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        dist.broadcast(buffer, src=self._output_rank, group=self._control)
        return buffer.numpy().tobytes()

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.worker.shutdown()
