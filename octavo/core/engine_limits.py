"""What the engine reports about its model (``ModelInfo``) and what it checks
every request against (``EngineLimits``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.core.pooling_params import PoolerConfig
from octavo.core.structured_output.compiler import StructuredOutputLimits


@dataclass
class ModelInfo:
    """What the front ends report about the loaded model and how it runs
    (the server's configuration panel shows all of it)."""

    model_path: str
    architecture: str
    dtype: str
    platform: str
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # the method in use: requested, or the checkpoint's own
    # The attention backends the workers' layers use (one, unless layers differ).
    attention_backends: tuple[str, ...] = ()
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_prefix_caching: bool = True
    # Sampling values requests that leave them unset get (--generation-config).
    sampling_defaults: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineLimits:
    """What the engine checks every request against."""

    max_model_len: int
    vocab_size: int
    block_size: int
    eos_token_ids: frozenset[int]
    max_logprobs: int = 20
    structured_outputs: StructuredOutputLimits = field(default_factory=StructuredOutputLimits)
    # Set when the model pools (embeddings, classification) instead of generating.
    pooler: PoolerConfig | None = None
    # LoRA (0: off): adapters served at once, their largest rank, and the
    # modules an adapter may name with their whole (in, out) sizes.
    max_loras: int = 0
    max_lora_rank: int = 0
    lora_targets: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Images a prompt may show (0: the model takes none).
    max_images_per_prompt: int = 0

    @property
    def task(self) -> str:
        return "generate" if self.pooler is None else self.pooler.task
