"""The check a request's LoRA adapter passes before the request is queued.

Mixed into ``RequestValidator`` (the engine's and the data-parallel
front's). An adapter is read once per id (its config and its safetensors
header, not its tensors) and checked against the modules the workers gave
LoRA to, so that a worker never meets an adapter it cannot load.
"""

from __future__ import annotations

from octavo.core.engine_limits import EngineLimits
from octavo.core.lora_request import LoRARequest
from octavo.errors import InvalidArgumentError, LoRAAdapterError


class LoRAValidation:
    limits: EngineLimits

    def check_lora_request(self, lora_request: LoRARequest | None, pooling: bool = False) -> None:
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise InvalidArgumentError(
                f"lora_request must be a LoRARequest, got {type(lora_request).__name__}", param="lora_request"
            )
        if self.limits.max_loras <= 0:
            raise LoRAAdapterError(
                "LoRA adapters are not enabled: start the engine with enable_lora=True (--enable-lora)",
                param="lora_request",
            )
        if pooling:
            raise LoRAAdapterError("LoRA adapters are served for text generation only", param="lora_request")
        if not hasattr(self, "_checked_loras"):
            self._checked_loras: dict[int, LoRARequest] = {}  # by id, once checked
        checked = self._checked_loras
        known = checked.get(lora_request.lora_int_id)
        if known is not None:
            if known.lora_path != lora_request.lora_path:
                raise LoRAAdapterError(
                    f"lora_int_id {lora_request.lora_int_id} already names the adapter at {known.lora_path}; "
                    "give another adapter another id",
                    param="lora_request",
                )
            return
        from octavo.lora.peft_adapter import check_adapter

        check_adapter(lora_request.lora_path, self.limits.lora_targets, self.limits.max_lora_rank)
        checked[lora_request.lora_int_id] = lora_request
