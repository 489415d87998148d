"""Hugging Face transformers on the same model and workload, for comparison."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def load_hf_model(model_path: str | Path, dtype: torch.dtype, device: torch.device, dummy: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    if dummy:
        config = AutoConfig.from_pretrained(str(model_path))
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype).to(device)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_generate_seconds(model, prompts: list[list[int]], max_new_tokens: int, device, static_cache: bool = False) -> float:
    """Wall time of one ``generate`` over a padded batch (all prompts the same length)."""
    input_ids = torch.tensor(prompts, device=device)
    kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    if static_cache:
        kwargs["cache_implementation"] = "static"
    _sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    _sync(device)
    return time.perf_counter() - started


def hf_generate_batch_seconds(model, prompts: list[list[int]], max_new_tokens: int, device) -> float | None:
    """HF's continuous batching (``generate_batch``), if this transformers has it."""
    if not hasattr(model, "generate_batch"):
        return None
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    _sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        model.generate_batch(inputs=prompts, generation_config=config, progress_bar=True)
    _sync(device)
    return time.perf_counter() - started


def free(model) -> None:
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
