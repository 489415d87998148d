"""Small PEFT LoRA adapters for a test checkpoint, and Hugging Face + PEFT as their reference."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapter(base_dir: Path, out_dir: Path, seed: int, **lora_options) -> Path:
    """A PEFT adapter with random (non-zero) A and B, saved as safetensors."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    lora_options.setdefault("target_modules", ALL_PROJECTIONS)
    config = LoraConfig(init_lora_weights=False, **lora_options)
    model = get_peft_model(base, config)
    with torch.no_grad():  # B at a scale that moves the greedy tokens without swamping the model
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.2)
    model.save_pretrained(str(out_dir))
    return out_dir


@lru_cache(maxsize=4)
def _peft_model(base_dir: str, adapter_dir: str | None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    return model.eval()


def peft_greedy(base_dir: Path, adapter_dir: Path | None, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens of the base model with the adapter applied by PEFT (None: the base model)."""
    model = _peft_model(str(base_dir), str(adapter_dir) if adapter_dir is not None else None)
    input_ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()
