"""LoRA adapters: PEFT adapter files (``peft_adapter``), the per-layer
update over all loaded adapters (``layer``) and a worker's adapter slots
(``slots``). ``octavo.LoRARequest`` names an adapter in a request; vLLM's
import path ``octavo.lora.request`` works too."""
