"""A worker's adapters: which LoRA sits in which slot of its layers.

Each step, before its inputs are prepared, ``prepare_step`` makes sure the
adapter of every scheduled request is in a slot (loading it from the CPU
cache or from disk; evicting the least recently used adapter that no
scheduled request needs) and records each request's slot by its runner row
(``row_slots``). The scheduler admits at most ``max_loras`` distinct
adapters among running requests, so a step never needs more slots than
there are. Slot writes are queued on the device in stream order: a step
already launched reads the slots as they were when it was launched.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import torch

from octavo.core.lora_request import LoRARequest
from octavo.core.scheduler_output import SchedulerOutput
from octavo.lora.layer import ALL_SHARDS, LinearLoRA, LoRAStepInputs
from octavo.lora.peft_adapter import AdapterModule, Targets, load_adapter

logger = logging.getLogger(__name__)


class LoRASlots:
    def __init__(
        self, layers: dict[str, LinearLoRA], inputs: LoRAStepInputs, max_num_reqs: int, max_cpu_loras: int
    ) -> None:
        self.inputs = inputs
        self.max_loras = inputs.shape.max_loras
        self.max_cpu_loras = max(max_cpu_loras, self.max_loras)
        # PEFT module name -> (its layer's LoRA, its target there).
        self.by_module = {name: (lora, t) for lora in layers.values() for name, t in lora.targets.items()}
        self.layers = list(layers.values())
        self.dtype = inputs.slot_onehot.dtype
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, least recently used first
        self.cpu_cache: OrderedDict[int, list[AdapterModule]] = OrderedDict()
        self.known: dict[int, LoRARequest] = {}
        # Each runner row's slot this step (-1: no adapter); rows index it per token.
        self.row_slots = np.full(max_num_reqs, -1, dtype=np.int32)

    def targets(self) -> Targets:
        """What adapters may name: module -> whole (in, out) sizes."""
        return {name: (target.in_features, target.out_features) for name, (_, target) in self.by_module.items()}

    def prepare_step(self, scheduler_output: SchedulerOutput, states) -> None:
        for new in scheduler_output.new_requests:
            if new.lora_request is not None:
                self.known[new.lora_request.lora_int_id] = new.lora_request
        needed = {states[r].lora_int_id for r in scheduler_output.num_scheduled_tokens} - {0}
        for adapter_id in needed:
            self._activate(adapter_id, needed)
        row_slots, slot_of = self.row_slots, self.slot_of
        for request_id in scheduler_output.num_scheduled_tokens:
            state = states[request_id]
            row_slots[state.row] = slot_of[state.lora_int_id] if state.lora_int_id else -1

    def token_slots(self, token_rows: np.ndarray, total_tokens: int) -> torch.Tensor:
        """Each token's slot, padded with -1 to ``total_tokens``."""
        slots = np.full(total_tokens, -1, dtype=np.int32)
        slots[: len(token_rows)] = self.row_slots[token_rows]
        return torch.from_numpy(slots)

    def _activate(self, adapter_id: int, needed: set[int]) -> None:
        if adapter_id in self.slot_of:
            self.slot_of.move_to_end(adapter_id)
            return
        used = set(self.slot_of.values())
        free = [slot for slot in range(self.max_loras) if slot not in used]
        if not free:
            victim = next((a for a in self.slot_of if a not in needed), None)
            if victim is None:
                raise RuntimeError(f"a step needs more than max_loras={self.max_loras} adapters")
            free = [self.slot_of.pop(victim)]
        slot = free[0]
        self._write(slot, self._modules(adapter_id))
        self.slot_of[adapter_id] = slot

    def _modules(self, adapter_id: int) -> list[AdapterModule]:
        modules = self.cpu_cache.get(adapter_id)
        if modules is None:
            request = self.known[adapter_id]
            logger.info("loading LoRA adapter %s (id %d) from %s", request.lora_name, adapter_id, request.lora_path)
            modules = load_adapter(request.lora_path, self.dtype)
            self.cpu_cache[adapter_id] = modules
            while len(self.cpu_cache) > self.max_cpu_loras:
                self.cpu_cache.popitem(last=False)
        self.cpu_cache.move_to_end(adapter_id)
        return modules

    def _write(self, slot: int, modules: list[AdapterModule]) -> None:
        for lora in self.layers:
            lora.clear_slot(slot)
        for module in modules:
            lora, target = self.by_module[module.name]
            lora_a, lora_b = module.lora_a.to(lora.a_stack.device), module.lora_b.to(lora.a_stack.device)
            if target.shard != ALL_SHARDS:
                lora.write_slot(slot, target.shard, lora_a, lora_b)
                continue
            # A fused module's update: one A, its B's rows split shard by shard.
            for shard, shard_b in enumerate(lora_b.split(list(target.shard_sizes))):
                lora.write_slot(slot, shard, lora_a, shard_b)
