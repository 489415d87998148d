"""A worker: one device, one model runner, one rank of the parallel layout.

Every executor (in-process, multiprocess, Ray, torchrun) drives the same
``Worker``. With a ``RankInfo`` the worker first joins the process group (the
platform's ``dist_backend``) and builds its tensor- and pipeline-parallel
groups, so that the model it then builds holds only its slice: its heads and
features (TP), its layers (PP).

``execute_model`` is the same call on every rank. A pipeline stage other than
the first receives its input activations from the previous stage; one other
than the last sends its output to the next stage and returns ``None``. Only
the last stage samples; its ranks all compute the same logits (the LM head
all-gathers), and the executor uses the output of tensor rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.distributed.parallel_state import (
    destroy_distributed_environment,
    get_pp_group,
    init_distributed_environment,
    initialize_model_parallel,
)
from octavo.plugins.selection import select_platform
from octavo.runtime.config import WorkerConfig, dtype_from_name
from octavo.runtime.model_runner import ModelRunner


@dataclass
class RankInfo:
    """Where a worker sits in the world; plain values (sent as msgpack)."""

    rank: int
    world_size: int
    # tcp://host:port of the rendezvous store, or "env://" under torchrun.
    init_method: str
    # Index of this worker's device among the devices this process can see.
    local_rank: int = 0


class Worker:
    def __init__(self, config: WorkerConfig, local_rank: int = 0, rank_info: RankInfo | None = None) -> None:
        self.config = config
        self.platform = select_platform(config.platform).platform
        if rank_info is not None:
            local_rank = rank_info.local_rank
        self.local_rank = local_rank
        self.device = self.platform.device(local_rank)
        self.platform.set_device(local_rank)
        self.rank_info = rank_info
        if rank_info is not None and rank_info.world_size > 1:
            init_distributed_environment(
                rank_info.rank, rank_info.world_size, rank_info.init_method, self.platform.dist_backend
            )
            initialize_model_parallel(config.tensor_parallel_size, config.pipeline_parallel_size)
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(config, self.platform, self.device)

    def load_model(self) -> None:
        self.runner.load_model()

    def determine_num_kv_blocks(self) -> int:
        return self.runner.determine_num_kv_blocks()

    def attention_backend_names(self) -> list[str]:
        """The backends this rank's layers use, sorted (reported, not used)."""
        return sorted({backend.name for backend in self.runner.loaded.layer_backends})

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)

    def lora_targets(self) -> dict[str, tuple[int, int]]:
        """The modules a LoRA adapter may name: whole (in, out) sizes; {} with LoRA off."""
        return self.runner.lora_targets()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        pp = get_pp_group()
        if pp.world_size == 1:
            return self.runner.execute_model(scheduler_output)
        from octavo.distributed.pipeline import recv_intermediate, send_intermediate

        intermediate = None
        if not pp.is_first and not scheduler_output.is_empty:
            intermediate = recv_intermediate(
                scheduler_output.total_num_scheduled_tokens,
                self.runner.loaded.arch.hidden_size,
                dtype_from_name(self.config.dtype),
                self.device,
            )
        result = self.runner.execute_model(scheduler_output, intermediate)
        if pp.is_last:
            return result
        if not scheduler_output.is_empty:
            send_intermediate(*result)
        return None

    def reload_weights(self, weights_path: str | None = None) -> int:
        """Copy a checkpoint's tensors into the running model (``runtime/weight_reload.py``)."""
        from octavo.runtime.weight_reload import reload_weights

        return reload_weights(self.runner, weights_path)

    def load_weights(self, weights) -> int:
        """Copy ``(name, tensor)`` pairs into the running model (one process only)."""
        from octavo.runtime.weight_reload import load_weights

        return load_weights(self.runner, weights)

    def overlaps_pooling_steps(self) -> bool:
        """Whether this worker's pooling steps may be launched two at a time (one device only)."""
        pooling = self.runner.pooling
        return pooling is not None and get_pp_group().world_size == 1 and pooling.overlaps_steps()

    def launch_pooling_step(self, scheduler_output: SchedulerOutput):
        """A pooling step launched without waiting: a ``PendingOutput``."""
        return self.runner.launch_pooling_step(scheduler_output)

    def execute_model_async(self, scheduler_output: SchedulerOutput):
        """Async scheduling (one device): launch the step, return a ``PendingOutput``."""
        return self.runner.execute_model_async(scheduler_output)

    def shutdown(self) -> None:
        if self.rank_info is not None and self.rank_info.world_size > 1:
            destroy_distributed_environment()

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.runner.eos_token_ids
