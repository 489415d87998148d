"""Host-side planning for the Triton paged-attention backend: which kernel
path a step takes and with what tile shape, decided once per step from
host values so that ``forward`` never synchronises.

The heuristic (``SplitKvPolicy.num_splits``):

- Mixed or prefill batches (``max_query_len > 1``) take the one-launch
  paged-attention kernel with prefill tiles.
- Decode batches (``max_query_len == 1``) take the decode kernel. It splits
  each context when one program per (request, KV head) would leave the GPU
  under-filled (fewer than ``programs_per_sm * num_sms``) and the longest
  context has at least ``min_seq_len`` tokens: splits = that shortfall
  rounded down to a power of two, at most ``max_splits`` and at most one per
  ``min_tokens_per_split`` tokens. Otherwise one program per (request, KV
  head) walks the whole context.

Tile shapes can be overridden for tuning runs with ``OCTAVO_TILES_DECODE``,
``OCTAVO_TILES_SPLIT`` and ``OCTAVO_TILES_PREFILL`` (decode with an fp8
cache: ``OCTAVO_TILES_DECODE_FP8``, ``OCTAVO_TILES_SPLIT_FP8``,
``OCTAVO_TILES_PREFILL_FP8``), each
``block_m,block_n,num_warps,num_stages`` (read once per process), and the
split threshold with ``OCTAVO_SPLIT_MIN_SEQ_LEN`` (``SplitKvPolicy.from_env``).

Graph capture: the split count depends on the batch size and on
``max_seq_len``, not on the contexts themselves (each split sizes its chunk
from ``seq_lens`` on the device), so build the capture metadata with
``max_seq_len`` set to the longest context the graph will serve (e.g.
``max_model_len``) and the graph replays correctly for any shorter one.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

# What the CPU (Triton's interpreter) pretends to have, so that plans are
# deterministic in tests.
CPU_NUM_SMS = 8


@dataclass(frozen=True)
class SplitKvPolicy:
    # Measured on the H200 (batch 1, 8 KV heads): 512 tokens take 18.9 us in
    # one launch and 11.8 us split; shorter contexts gain little.
    min_seq_len: int = 256
    max_splits: int = 32
    programs_per_sm: int = 2
    # A split smaller than this costs more in merging than it saves.
    min_tokens_per_split: int = 64

    @classmethod
    def from_env(cls) -> "SplitKvPolicy":
        """The default policy, ``min_seq_len`` from ``OCTAVO_SPLIT_MIN_SEQ_LEN`` if set."""
        value = os.environ.get("OCTAVO_SPLIT_MIN_SEQ_LEN")
        if not value:
            return cls()
        if not value.isdigit():
            raise ValueError(f"OCTAVO_SPLIT_MIN_SEQ_LEN={value!r}: expected a number of tokens")
        return cls(min_seq_len=int(value))

    def fills_gpu(self, num_reqs: int, num_kv_heads: int, num_sms: int) -> bool:
        """One program per (request, KV head) gives every SM ``programs_per_sm`` or more."""
        return num_reqs * num_kv_heads >= self.programs_per_sm * num_sms

    def num_splits(self, num_reqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int, num_sms: int) -> int:
        """1 for the one-launch kernel, else the number of context splits."""
        if max_query_len != 1 or max_seq_len < self.min_seq_len or num_reqs == 0:
            return 1
        programs = num_reqs * num_kv_heads
        wanted = -(-self.programs_per_sm * num_sms // programs)
        limit = min(wanted, self.max_splits, max(1, max_seq_len // self.min_tokens_per_split))
        splits = 1
        while splits * 2 <= limit:
            splits *= 2
        return splits


_NUM_SMS: dict[str, int] = {}


def num_compute_units(device: torch.device) -> int:
    """Streaming multiprocessors (CUs on ROCm) of ``device``; cached."""
    key = str(device)
    if key not in _NUM_SMS:
        if device.type == "cuda":
            _NUM_SMS[key] = torch.cuda.get_device_properties(device).multi_processor_count
        else:
            _NUM_SMS[key] = CPU_NUM_SMS
    return _NUM_SMS[key]


@functools.cache
def _tiles_from_env(name: str):
    from octavo.kernels.paged_attention import TileConfig

    value = os.environ.get(f"OCTAVO_TILES_{name}")
    if not value:
        return None
    try:
        block_m, block_n, num_warps, num_stages = (int(part) for part in value.split(","))
    except ValueError:
        raise ValueError(f"OCTAVO_TILES_{name}={value!r}: expected block_m,block_n,num_warps,num_stages") from None
    return TileConfig(block_m, block_n, num_warps, num_stages)


def tiles_for_step(
    max_query_len: int, num_splits: int, head_size: int, gpu_is_full: bool = False, fp8_cache: bool = False
):
    """The tile shape of a step's attention kernel (see the module docstring).

    ``gpu_is_full``: a decode batch with at least ``programs_per_sm`` programs
    per SM without splitting. ``fp8_cache``: decode steps read a one-byte
    cache and take its own tiles (``OCTAVO_TILES_SPLIT_FP8`` and
    ``OCTAVO_TILES_DECODE_FP8`` override them). Prefill reads the step's own
    keys in the activations' dtype but a chunk's context from the fp8 cache:
    ``OCTAVO_TILES_PREFILL_FP8`` (if set) before ``OCTAVO_TILES_PREFILL``."""
    from octavo.kernels.paged_attention import tiles_for
    from octavo.kernels.split_kv_decode import default_decode_tiles

    if max_query_len > 1:
        own = _tiles_from_env("PREFILL_FP8") if fp8_cache else None
        return own or _tiles_from_env("PREFILL") or tiles_for(max_query_len, head_size)
    name = ("SPLIT" if num_splits > 1 else "DECODE") + ("_FP8" if fp8_cache else "")
    return _tiles_from_env(name) or default_decode_tiles(num_splits > 1, fp8_cache, gpu_is_full)
