"""vLLM's import path: ``from octavo.lora.request import LoRARequest``."""

from octavo.core.lora_request import LoRARequest

__all__ = ["LoRARequest"]
