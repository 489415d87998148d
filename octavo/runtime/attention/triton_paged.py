"""Paged attention with Triton kernels: the GPU fast path.

Same KV cache layout as the torch reference backend: ``[2, num_blocks,
block_size, num_kv_heads, head_size]``. ``build_metadata`` plans the step on
the host (``triton_plan``): kernel path, tile shape, split workspace.
``forward`` then only launches kernels: the KV write (negative slots
skipped), and either the one-launch mixed-batch kernel (any batch with a
request of several query tokens) or the decode kernel (one token per
request: one program per request and KV head, or split-KV plus its merge). It does no host synchronisation and its grids depend only on
tensor shapes and the plan, so it can be captured in a CUDA graph and
replayed after the batch tensors are refilled in place; rows of padding
tokens come out finite (zeros) and are to be ignored.

The cache may be fp8 (``kv_cache_dtype`` float8_e4m3fn or float8_e5m2: half
the bytes, twice the sequences): keys and values are stored divided by the
layer's scales (``set_kv_scales``; 1.0 unless the checkpoint has them) and
widened in registers when read. Prefill and mixed steps read each request's
new tokens from the step's own K/V instead (``_attends_fresh``), decode
steps take fp8 tiles of their own (``triton_plan.tiles_for_step``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from octavo.core.attention import AttentionBackend, AttentionBatch, AttentionSpec
from octavo.runtime.attention.triton_plan import SplitKvPolicy, num_compute_units, tiles_for_step

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
MAX_HEAD_SIZE = 256


@dataclass
class TritonPagedMetadata:
    batch: Any  # octavo.kernels.paged_attention.PagedBatch
    slot_mapping: torch.Tensor  # [T] int64, negative = padding
    num_actual_tokens: int
    max_query_len: int
    tiles: Any  # octavo.kernels.paged_attention.TileConfig
    num_splits: int  # decode batches: 1 = one program per (request, KV head); >1 = split-KV
    workspace: Any = None  # SplitWorkspace when num_splits > 1

    def split_workspace(self, num_tokens: int, num_heads: int, head_size: int, device: torch.device):
        """The split workspace for this shape: made once per step, shared by layers."""
        from octavo.kernels.split_kv_decode import SplitWorkspace

        ws = self.workspace
        wanted = SplitWorkspace.acc_shape(num_tokens, num_heads, head_size, self.num_splits)
        if ws is None or tuple(ws.acc.shape) != wanted:
            ws = SplitWorkspace.allocate(num_tokens, num_heads, head_size, self.num_splits, device)
            self.workspace = ws
        return ws


class TritonPagedAttention(AttentionBackend):
    name = "triton_paged"
    metadata_class: type[TritonPagedMetadata] = TritonPagedMetadata  # a subclass's may carry more
    supports_graph_capture = True
    fuses_rotary = True
    supports_kv_scales = True
    supports_logits_soft_cap = True
    supports_sinks = True  # in both kernels; layers with sinks never take forward_with_rotary

    def __init__(self, spec: AttentionSpec, split_policy: SplitKvPolicy | None = None) -> None:
        super().__init__(spec)
        self.split_policy = split_policy or SplitKvPolicy.from_env()
        from octavo.kernels.paged_attention import AttentionParams
        from octavo.env_switches import switch_from_env

        # A/B runs: prefill over a 16/32-bit cache reads the step's own K/V too
        # (contiguous rows, no block-table gather) at the cost of a separate rotary launch.
        self.fresh_for_every_cache = switch_from_env("OCTAVO_PREFILL_FRESH_KV", default=False)

        self.params = AttentionParams(scale=spec.scale, sliding_window=spec.sliding_window, soft_cap=spec.logits_soft_cap)

    @classmethod
    def supports(cls, spec: AttentionSpec) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
        if spec.num_heads % spec.num_kv_heads:
            return f"num_heads ({spec.num_heads}) is not a multiple of num_kv_heads ({spec.num_kv_heads})"
        if spec.head_size > MAX_HEAD_SIZE or spec.head_size % 2:
            return f"head_size {spec.head_size} is not supported (even sizes up to {MAX_HEAD_SIZE} are)"
        if spec.dtype not in SUPPORTED_DTYPES:
            return f"dtype {spec.dtype} is not supported (float16, bfloat16, float32 are)"
        if spec.kv_cache_dtype not in SUPPORTED_DTYPES + FP8_KV_DTYPES:
            return f"kv_cache_dtype {spec.kv_cache_dtype} is not supported (float16, bfloat16, float32, fp8 are)"
        return None

    def set_kv_scales(self, k_scale: float, v_scale: float) -> str | None:
        reason = super().set_kv_scales(k_scale, v_scale)
        if reason is None:
            self.params = dataclasses.replace(self.params, k_scale=self.k_scale, v_scale=self.v_scale)
        return reason

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.spec
        return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)

    def build_metadata(self, batch: AttentionBatch) -> TritonPagedMetadata:
        from octavo.kernels.paged_attention import PagedBatch

        device = batch.block_table.device
        num_sms = num_compute_units(device)
        policy, num_kv_heads = self.split_policy, self.spec.num_kv_heads
        num_splits = policy.num_splits(batch.num_reqs, num_kv_heads, batch.max_query_len, batch.max_seq_len, num_sms)
        gpu_is_full = policy.fills_gpu(batch.num_reqs, num_kv_heads, num_sms)
        fp8_cache = self.spec.kv_cache_dtype in FP8_KV_DTYPES
        metadata = self.metadata_class(
            batch=PagedBatch(batch.query_start_loc, batch.seq_lens, batch.block_table, batch.num_reqs),
            slot_mapping=batch.slot_mapping,
            num_actual_tokens=batch.num_actual_tokens,
            max_query_len=batch.max_query_len,
            tiles=tiles_for_step(batch.max_query_len, num_splits, self.spec.head_size, gpu_is_full, fp8_cache),
            num_splits=num_splits,
        )
        if num_splits > 1:
            spec = self.spec
            metadata.split_workspace(batch.slot_mapping.shape[0], spec.num_heads, spec.head_size, device)
        return metadata

    def forward(self, query, key, value, kv_cache, metadata: TritonPagedMetadata, sinks=None) -> torch.Tensor:
        from octavo.kernels.kv_cache_write import reshape_and_cache

        self._check_slots(key, metadata)
        reshape_and_cache(key, value, kv_cache, metadata.slot_mapping, self.k_scale, self.v_scale)
        fresh = (key, value) if self._attends_fresh(metadata) else None
        return self._attend(query, kv_cache, metadata, fresh, sinks)

    def forward_with_rotary(
        self, query, key, value, kv_cache, metadata, positions, cos_sin_cache, rotary_and_cache
    ) -> torch.Tensor:
        self._check_slots(key, metadata)
        if (self.k_scale, self.v_scale) != (1.0, 1.0):
            raise ValueError("rotary_and_cache does not apply KV-cache scales: call forward (the attention layer does)")
        if self._attends_fresh(metadata):
            # The fused op leaves ``key`` unrotated, and fresh attention needs
            # it rotated: rotate in place, then write (two launches, prefill only).
            from octavo.kernels.rotary import apply_rotary

            query, key = apply_rotary(positions, query, key, cos_sin_cache)
            return self.forward(query, key, value, kv_cache, metadata)
        query = rotary_and_cache(positions, query, key, value, cos_sin_cache, kv_cache, metadata.slot_mapping)
        return self._attend(query, kv_cache, metadata)

    def _attends_fresh(self, metadata: TritonPagedMetadata) -> bool:
        """Prefill over an fp8 cache reads the step's own K/V in the
        activations' dtype (``paged_attention``'s ``fresh_kv``): widening
        fp8 tiles in registers made a 32k-token prefill 25% slower (H200).
        Decode keeps reading the cache. Not with KV scales (the fresh
        values are unscaled). ``OCTAVO_PREFILL_FRESH_KV=1``: with any cache."""
        return (
            metadata.max_query_len > 1
            and (self.spec.kv_cache_dtype in FP8_KV_DTYPES or self.fresh_for_every_cache)
            and (self.k_scale, self.v_scale) == (1.0, 1.0)
        )

    @staticmethod
    def _check_slots(key: torch.Tensor, metadata: TritonPagedMetadata) -> None:
        if metadata.slot_mapping.shape[0] < key.shape[0]:
            raise ValueError(f"slot_mapping has {metadata.slot_mapping.shape[0]} slots for {key.shape[0]} tokens")

    def _attend(self, query, kv_cache, metadata: TritonPagedMetadata, fresh_kv=None, sinks=None) -> torch.Tensor:
        from octavo.kernels.paged_attention import paged_attention
        from octavo.kernels.split_kv_decode import split_kv_decode

        if query.stride(-1) != 1:
            query = query.contiguous()
        if metadata.max_query_len == 1:
            workspace = metadata.split_workspace(*query.shape, query.device) if metadata.num_splits > 1 else None
            return split_kv_decode(query, kv_cache, metadata.batch, self.params, workspace, metadata.tiles, sinks=sinks)
        return paged_attention(query, kv_cache, metadata.batch, self.params, metadata.tiles, fresh_kv=fresh_kv, sinks=sinks)
