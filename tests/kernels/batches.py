"""Random mixed batches over a paged KV cache, for the attention kernel tests.

A batch is described request by request as ``(seq_len, query_len)``: the
request computes its last ``query_len`` tokens; the ``seq_len - query_len``
before them are already in the cache. Blocks are handed out in a shuffled
order; ``share_prefix_with`` lets a request reuse another's leading full
blocks (a prefix-cache hit). The whole cache starts as random values, so a
kernel that reads a slot it should not shows up as a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.core.attention import AttentionBatch


@dataclass
class RequestShape:
    seq_len: int
    query_len: int
    share_prefix_with: int | None = None  # index of an earlier request
    num_shared_blocks: int = 0


@dataclass
class BatchSpec:
    requests: list[RequestShape]
    num_heads: int = 8
    num_kv_heads: int = 2
    head_size: int = 32
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    num_padding_tokens: int = 0
    seed: int = 0


@dataclass
class MixedBatch:
    spec: BatchSpec
    query: torch.Tensor  # [T, H, D]
    key: torch.Tensor  # [T, Hkv, D] of the computed tokens
    value: torch.Tensor
    kv_cache: torch.Tensor  # context already written, new tokens not yet
    attn_batch: AttentionBatch
    extra: dict = field(default_factory=dict)

    @property
    def num_actual_tokens(self) -> int:
        return self.attn_batch.num_actual_tokens


def _block_tables(spec: BatchSpec, generator: torch.Generator) -> tuple[list[list[int]], int]:
    block_size = spec.block_size
    needed = sum(-(-r.seq_len // block_size) for r in spec.requests)
    num_blocks = needed + 4  # spare blocks nobody owns
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables: list[list[int]] = []
    for request in spec.requests:
        shared = tables[request.share_prefix_with][: request.num_shared_blocks] if request.share_prefix_with is not None else []
        own = [order.pop() for _ in range(-(-request.seq_len // block_size) - len(shared))]
        tables.append(shared + own)
    return tables, num_blocks


def make_batch(spec: BatchSpec, device: torch.device) -> MixedBatch:
    generator = torch.Generator().manual_seed(spec.seed)
    tables, num_blocks = _block_tables(spec, generator)
    block_size, hkv, d = spec.block_size, spec.num_kv_heads, spec.head_size

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(spec.dtype).to(device)

    kv_cache = randn(2, num_blocks, block_size, hkv, d)
    query_lens = [r.query_len for r in spec.requests]
    num_actual = sum(query_lens)
    num_tokens = num_actual + spec.num_padding_tokens
    slots = []
    for request, table in zip(spec.requests, tables):
        positions = range(request.seq_len - request.query_len, request.seq_len)
        slots += [table[p // block_size] * block_size + p % block_size for p in positions]
    slots += [-1] * spec.num_padding_tokens
    width = max(len(t) for t in tables)
    block_table = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, table in enumerate(tables):
        block_table[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
    query_start_loc = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    seq_lens = torch.tensor([r.seq_len for r in spec.requests], dtype=torch.int32)
    attn_batch = AttentionBatch(
        query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens.to(device),
        block_table=block_table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        num_reqs=len(tables),
        num_actual_tokens=num_actual,
        max_query_len=max(query_lens),
        max_seq_len=int(seq_lens.max()),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
    )
    return MixedBatch(
        spec=spec,
        query=randn(num_tokens, spec.num_heads, d),
        key=randn(num_tokens, hkv, d),
        value=randn(num_tokens, hkv, d),
        kv_cache=kv_cache,
        attn_batch=attn_batch,
    )


def mixed_requests() -> list[RequestShape]:
    """Two decode rows, a whole prompt, a chunk with context, a prefix-cache hit."""
    return [
        RequestShape(seq_len=37, query_len=1),
        RequestShape(seq_len=21, query_len=21),
        RequestShape(seq_len=50, query_len=13),
        RequestShape(seq_len=16, query_len=1),
        RequestShape(seq_len=40, query_len=8, share_prefix_with=2, num_shared_blocks=2),
    ]


def decode_requests(seq_lens: list[int]) -> list[RequestShape]:
    return [RequestShape(seq_len=s, query_len=1) for s in seq_lens]
