"""A worker: one device, one model runner."""

from __future__ import annotations

import torch

from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.plugins.selection import select_platform
from octavo.runtime.config import WorkerConfig
from octavo.runtime.model_runner import ModelRunner


class Worker:
    def __init__(self, config: WorkerConfig, local_rank: int = 0) -> None:
        self.config = config
        self.platform = select_platform(config.platform).platform
        self.local_rank = local_rank
        self.device = self.platform.device(local_rank)
        self.platform.set_device(local_rank)
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(config, self.platform, self.device)

    def load_model(self) -> None:
        self.runner.load_model()

    def determine_num_kv_blocks(self) -> int:
        return self.runner.determine_num_kv_blocks()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.runner.eos_token_ids
