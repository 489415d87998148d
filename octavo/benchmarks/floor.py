"""The physical floor: what the hardware allows, measured in the same run.

Bandwidth is a device-to-device copy (bytes read plus bytes written over
time, the way the copy bandwidth of a GPU is usually quoted); compute is a
large bf16 matrix product. A decode step must read every weight once plus
the KV cache of every sequence, so it cannot beat ``bytes / bandwidth``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from octavo.models.config import ModelArchConfig


@dataclass
class DeviceCeilings:
    copy_bytes_per_s: float
    matmul_flops_per_s: float


def _timed(fn, device: torch.device, iters: int) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - started) / iters


def _time_copy(num_bytes: int, device: torch.device) -> float:
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _timed(lambda: dst.copy_(src), device, iters=20)


def measure_ceilings(device: torch.device, copy_bytes: int = 1 << 31, matmul_size: int = 8192) -> DeviceCeilings:
    if device.type == "cpu":
        copy_bytes, matmul_size = 1 << 26, 1024
    copy_time = _time_copy(copy_bytes, device)
    dtype = torch.bfloat16 if device.type != "cpu" else torch.float32
    a = torch.randn(matmul_size, matmul_size, dtype=dtype, device=device)
    b = torch.randn(matmul_size, matmul_size, dtype=dtype, device=device)
    matmul_time = _timed(lambda: a @ b, device, iters=10)
    return DeviceCeilings(2 * copy_bytes / copy_time, 2 * matmul_size**3 / matmul_time)


@dataclass
class ModelCost:
    num_params: int
    weight_bytes: int
    kv_bytes_per_token: int

    @property
    def flops_per_token(self) -> int:
        return 2 * self.num_params


def model_cost(arch: ModelArchConfig, dtype_bytes: int, weight_bits: float | None = None) -> ModelCost:
    """Parameter count and bytes from the config (``weight_bits`` for quantized linears)."""
    hidden, inter, layers = arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_key_value_heads * arch.head_dim
    linear = layers * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter)
    embed = arch.vocab_size * hidden
    head = 0 if arch.tie_word_embeddings else arch.vocab_size * hidden
    norms = layers * 2 * hidden + hidden
    bits = weight_bits if weight_bits is not None else 8 * dtype_bytes
    weight_bytes = int(linear * bits / 8) + (embed + head + norms) * dtype_bytes
    return ModelCost(linear + embed + head + norms, weight_bytes, 2 * layers * kv * dtype_bytes)


def decode_step_floor_s(cost: ModelCost, ceilings: DeviceCeilings, batch: int, context: float) -> float:
    """Seconds one decode step must take: weights plus every sequence's KV.

    All weights are counted, the embedding table included (as the project's
    quoted 3.90 ms floor for Llama-3.1-8B at batch 1 does)."""
    return (cost.weight_bytes + batch * context * cost.kv_bytes_per_token) / ceilings.copy_bytes_per_s


def prefill_floor_s(cost: ModelCost, ceilings: DeviceCeilings, num_tokens: int) -> float:
    """Seconds a prefill of ``num_tokens`` must take: compute or weight reads, whichever is longer."""
    compute = cost.flops_per_token * num_tokens / ceilings.matmul_flops_per_s
    return max(compute, cost.weight_bytes / ceilings.copy_bytes_per_s)
