"""Hugging Face transformers on the same model and workload, for comparison.

Modes (``--hf-mode``; the table names the one used):

- ``compiled`` (latency's default, HF's fastest path at small batch):
  ``generate`` with a static cache and ``torch.compile`` (HF compiles the
  decode forward itself; prefill runs eager). One ``StaticCache`` object,
  sized for the longest call and reset in place before each call, so the
  compiled graph (and its CUDA graphs) sees the same shapes and addresses
  every time; warmed up outside the timed region, and the timed region
  must compile nothing (``HFRecompiledError`` otherwise);
- ``static``: the same static cache, no compilation;
- ``eager``: ``generate`` with its default dynamic cache (HF's slowest path);
- ``generate_batch`` (throughput's only mode): HF's continuous batching.
"""

from __future__ import annotations

import gc
import inspect
import time
from pathlib import Path

import torch

from octavo.errors import OctavoError

LATENCY_MODES = ("compiled", "static", "eager")
THROUGHPUT_MODES = ("generate_batch",)
MODE_NAMES = {
    "compiled": "static cache + torch.compile",
    "static": "static cache, no compile",
    "eager": "dynamic cache, eager",
    "generate_batch": "generate_batch, continuous batching",
}


class HFRecompiledError(OctavoError):
    """Hugging Face compiled a graph inside the timed region: its figure would include compilation."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def compile_count() -> int:
    """Graphs torch.compile has produced in this process (recompilations included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def check_no_recompiles(before: int, what: str) -> None:
    new = compile_count() - before
    if new:
        raise HFRecompiledError(
            f"Hugging Face ({what}) compiled {new} new graph(s) inside the timed region, so its figure would "
            "include compilation; not reported"
        )


def cache_kwarg(model) -> str:
    """The name of the cache argument in this transformers (``cache`` from 5.2x, ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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


def compile_config(device: torch.device, backend: str = "inductor"):
    """HF's default compile settings; on the CPU, where HF does not compile
    by itself, told to compile anyway."""
    from transformers.generation import CompileConfig

    config = CompileConfig(backend=backend)
    if device.type == "cpu":
        config._compile_all_devices = True
    return config


class HFGenerate:
    """Timed ``generate`` calls in one mode; ``max_cache_len`` bounds every call's prompt + new tokens."""

    def __init__(self, model, mode: str, device: torch.device, max_cache_len: int, backend: str = "inductor") -> None:
        if mode not in LATENCY_MODES:
            raise ValueError(f"unknown Hugging Face latency mode {mode!r}")
        self.model, self.mode, self.device = model, mode, device
        self.cache = None
        self.extra: dict = {}
        if mode != "eager":
            from transformers import StaticCache

            self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
            self.extra[cache_kwarg(model)] = self.cache
            if mode == "compiled":
                self.extra["compile_config"] = compile_config(device, backend)
            else:
                self.extra["disable_compile"] = True

    def seconds(self, prompts: list[list[int]], max_new_tokens: int) -> float:
        """Wall time of one ``generate`` over a padded batch (all prompts the same length)."""
        input_ids = torch.tensor(prompts, device=self.device)
        if self.cache is not None:
            self.cache.reset()
        _sync(self.device)
        started = time.perf_counter()
        with torch.no_grad():
            self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens, do_sample=False, **self.extra,
            )
        _sync(self.device)
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
