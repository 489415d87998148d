"""What a worker needs to build its model runner: plain values only, so the
same object can be sent to worker processes as msgpack."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}


def dtype_from_name(name: str) -> torch.dtype:
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class WorkerConfig:
    model_path: str
    load_format: str  # "safetensors" | "dummy" | "gguf"
    dtype: str
    kv_cache_dtype: str
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    platform: str
    quantization: str | None = None
    seed: int = 0
    enforce_eager: bool = False
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    # Launch the next greedy decode step before this one's tokens reach the
    # host (runtime/decode_overlap.py); needs one token of KV lookahead.
    overlap_decode: bool = False
    # Launch each step before the previous one's samples reach the host
    # (runtime/async_steps.py); the scheduler counts them as placeholders.
    async_scheduling: bool = False
    # Steps of up to this many tokens replay CUDA graphs captured by token
    # count (runtime/prefill_graphs.py); 0 captures none.
    max_prefill_graph_tokens: int = 2048
    # The first device this engine's workers use (data-parallel replica r
    # starts at r * tensor_parallel_size * pipeline_parallel_size).
    device_index_offset: int = 0
    # generate, or a pooling task (embed, classify): resolved by the engine.
    task: str = "generate"
    # LoRA (``--enable-lora``): adapters served at once (0: LoRA off), their
    # largest rank, and how many loaded adapters a worker keeps in host memory.
    max_loras: int = 0
    max_lora_rank: int = 16
    max_cpu_loras: int = 0
    # Speculative decoding with a draft model: its checkpoint directory, and
    # the drafts it proposes a request per step (0: no draft model).
    speculative_model: str | None = None
    num_speculative_tokens: int = 0
    # "draft_model" (a smaller model of the same vocabulary) or "eagle3" (a head reading the target's hidden states).
    speculative_method: str = "draft_model"
    # ... and no guesses while this many requests or more are held (None: always).
    speculative_disable_by_batch_size: int | None = None
    # What logprobs report (vLLM's logprobs_mode; runtime/sampler.py).
    logprobs_mode: str = "raw_logprobs"
    # vLLM's hf_overrides: config.json values replaced before the model is built.
    hf_overrides: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)
