"""Split-KV decode attention: for batches of one query token per request
whose contexts are long compared with how many (request, kv head) programs
the GPU needs to be busy.

Stage 1, program ``(token, kv_head, split)``: the token's context (its
window, with a sliding window) is cut into ``num_splits`` chunks of whole
``BLOCK_N`` key tiles, sized from the request's ``seq_len`` on the device, so
the grid depends only on the number of tokens and splits and one captured
graph serves any context length. Each program writes its chunk's unnormalised
partial result: running max (base 2), sum of exponentials and accumulator,
float32, for every query head of the KV head's GQA group. An empty chunk
writes (-inf, 0, 0).

Stage 2, program ``(token, head)``: merges the splits' partials
(``max = max_s m_s``; ``out = sum_s acc_s 2^(m_s - max) / sum_s l_s 2^(m_s - max)``).

With one split (``workspace`` None) stage 1 normalises and writes the output
itself and there is no stage 2: the decode kernel for batches that fill the
GPU without splitting (large batches, short contexts).

Precondition: every request has exactly one query token (``max_query_len ==
1``), so token ``i`` is request ``i`` (``query_start_loc`` is ``0, 1, ...``)
and a program finds its request without searching; tokens ``>= num_reqs``
are padding and come out as zeros. Reference: ``octavo.kernels.reference.paged_attention_reference``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.attention_common import attend_keys
from octavo.kernels.paged_attention import AttentionParams, PagedBatch, TileConfig
from octavo.kernels.pdl import pdl_enabled, pdl_release, pdl_wait
from octavo.kernels.triton_utils import cache_dot_dtype, dot_precision, next_power_of_2

# block_m is unused: a program's rows are the GQA group (padded to 16).
SPLIT_TILES = TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=2)
# One program per (token, KV head) walking the whole context. With few
# programs (small batches) each must keep many keys in flight; with the GPU
# full (large batches), small light programs did best on the H200 (sweep in
# benchmarks/kernels_gpu_sweep.py: batch 512 x 256-512 tokens, 3.7-4.05 TB/s,
# 4-6% faster than 64 keys / 4 warps / 3 stages).
DIRECT_DECODE_TILES = TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=3)
FULL_GPU_DECODE_TILES = TileConfig(block_m=16, block_n=32, num_warps=2, num_stages=2)
# An fp8 cache: twice the keys per tile, so that each load in flight moves
# the bytes of the bf16 tile. With bf16's tiles an fp8 program keeps half
# the bytes in flight and, being latency-bound (batch 1 at 32k: 256
# programs on 132 SMs), took as long as bf16 (H200, issue 17: 5.74 against
# 5.75 ms/token). Not yet swept: ``benchmarks/kv_decode_sweep.py`` times
# these against the alternatives (and OCTAVO_TILES_*_FP8 override them).
FP8_SPLIT_TILES = TileConfig(block_m=16, block_n=128, num_warps=4, num_stages=2)
FP8_DIRECT_DECODE_TILES = TileConfig(block_m=16, block_n=128, num_warps=4, num_stages=3)
FP8_FULL_GPU_DECODE_TILES = TileConfig(block_m=16, block_n=64, num_warps=2, num_stages=2)


def default_decode_tiles(split: bool, fp8_cache: bool, gpu_is_full: bool = False) -> TileConfig:
    """The decode kernel's tiles: split-KV or direct (full GPU or not), per cache dtype."""
    if split:
        return FP8_SPLIT_TILES if fp8_cache else SPLIT_TILES
    if gpu_is_full:
        return FP8_FULL_GPU_DECODE_TILES if fp8_cache else FULL_GPU_DECODE_TILES
    return FP8_DIRECT_DECODE_TILES if fp8_cache else DIRECT_DECODE_TILES


@dataclass
class SplitWorkspace:
    """Float32 partial results of stage 1, reusable by every layer of a step."""

    acc: torch.Tensor  # [T, H, num_splits, HEAD_PAD]
    max: torch.Tensor  # [T, H, num_splits]
    sum: torch.Tensor  # [T, H, num_splits]

    @staticmethod
    def acc_shape(num_tokens: int, num_heads: int, head_size: int, num_splits: int) -> tuple[int, int, int, int]:
        return (num_tokens, num_heads, num_splits, max(16, next_power_of_2(head_size)))

    @classmethod
    def allocate(cls, num_tokens: int, num_heads: int, head_size: int, num_splits: int, device) -> "SplitWorkspace":
        head_pad = cls.acc_shape(num_tokens, num_heads, head_size, num_splits)[3]
        shape = (num_tokens, num_heads, num_splits)
        return cls(
            acc=torch.empty((*shape, head_pad), dtype=torch.float32, device=device),
            max=torch.empty(shape, dtype=torch.float32, device=device),
            sum=torch.empty(shape, dtype=torch.float32, device=device),
        )

    @property
    def num_splits(self) -> int:
        return self.max.shape[2]


# Not specialised on values that change between steps (see paged_attention).
@triton.jit(do_not_specialize=["num_reqs", "stride_table"])
def _split_kv_kernel(
    out_ptr, acc_ptr, max_ptr, sum_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    seq_lens_ptr, block_table_ptr, sinks_ptr,
    num_reqs, qk_scale, v_scale, sliding_window, soft_cap,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_block, stride_slot, stride_head, stride_table,
    GROUP: tl.constexpr, ROWS: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, USE_WINDOW: tl.constexpr, USE_SOFT_CAP: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr, USE_SINKS: tl.constexpr,
):
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # q and the newest key and value come from the kernel before; the merge
    # kernel (or the output projection) may be placed meanwhile.
    pdl_wait(PDL)
    pdl_release(PDL)
    req = token  # one token per request
    is_real = req < num_reqs
    seq_len = tl.load(seq_lens_ptr + req, mask=is_real, other=0)
    kv_lo = 0
    if USE_WINDOW:
        kv_lo = tl.maximum(seq_len - sliding_window, 0)
    num_tiles = tl.cdiv(seq_len - kv_lo, BLOCK_N)
    chunk = tl.cdiv(num_tiles, NUM_SPLITS) * BLOCK_N
    kv_start = kv_lo + split * chunk
    kv_end = tl.minimum(kv_start + chunk, seq_len)

    rows = tl.arange(0, ROWS)
    head = kv_head * GROUP + rows
    row_valid = rows < GROUP
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_SIZE
    q = tl.load(
        q_ptr + token.to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :], other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    if USE_SINKS:
        # The sink (one more logit, base 2, no value) joins the first split's
        # partial only: the merge then counts it once.
        first = row_valid & ((rows * 0 + split) == 0)  # a vector: the interpreter refused a scalar mask term
        # log2(e) as a literal: a kernel reads no global that is not a constexpr.
        m_i = tl.load(sinks_ptr + head, mask=first, other=float("-inf")).to(tl.float32) * 1.4426950408889634
        l_i = tl.where(first, 1.0, 0.0)
    acc = tl.zeros([ROWS, HEAD_PAD], tl.float32)
    table_row = block_table_ptr + req.to(tl.int64) * stride_table
    # The query is the last token: every key of the chunk is allowed, and
    # only the chunk's last, partial tile needs a mask.
    q_pos = tl.full([ROWS], seq_len - 1, tl.int32)
    kv_full_end = tl.maximum(kv_start + (kv_end - kv_start) // BLOCK_N * BLOCK_N, kv_start)
    m_i, l_i, acc = attend_keys(
        q, q_pos, m_i, l_i, acc, kv_start, kv_full_end, kv_end, sliding_window, qk_scale, soft_cap,
        k_cache_ptr, v_cache_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, 0,
        HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_N, False, False, USE_SOFT_CAP, DOT_DTYPE, PRECISION, False,
    )
    m_i, l_i, acc = attend_keys(
        q, q_pos, m_i, l_i, acc, kv_full_end, kv_end, kv_end, sliding_window, qk_scale, soft_cap,
        k_cache_ptr, v_cache_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, 0,
        HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_N, True, False, USE_SOFT_CAP, DOT_DTYPE, PRECISION, False,
    )

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None] * v_scale
        out_offsets = token.to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & dim_valid[None, :])
        return
    # Partials are [T, H, NUM_SPLITS(, HEAD_PAD)], contiguous.
    slot = (token.to(tl.int64) * (tl.num_programs(1) * GROUP) + head) * NUM_SPLITS + split
    tl.store(max_ptr + slot, m_i, mask=row_valid)
    tl.store(sum_ptr + slot, l_i, mask=row_valid)
    tl.store(acc_ptr + slot[:, None] * HEAD_PAD + dims[None, :], acc, mask=row_valid[:, None])


@triton.jit
def _merge_splits_kernel(
    out_ptr, acc_ptr, max_ptr, sum_ptr, v_scale, stride_ot, stride_oh,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    pdl_wait(PDL)
    pdl_release(PDL)
    base = (token * tl.num_programs(1) + head) * NUM_SPLITS
    splits = tl.arange(0, NUM_SPLITS)
    maxes = tl.load(max_ptr + base + splits)
    sums = tl.load(sum_ptr + base + splits)
    m_max = tl.max(maxes, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    weight = tl.exp2(maxes - m_safe)
    total = tl.sum(sums * weight, 0)
    dims = tl.arange(0, HEAD_PAD)
    acc = tl.load(acc_ptr + (base + splits)[:, None] * HEAD_PAD + dims[None, :])
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total) * v_scale
    out_offsets = token * stride_ot + head * stride_oh + dims
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_SIZE)


def split_kv_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    batch: PagedBatch,
    params: AttentionParams,
    workspace: SplitWorkspace | None,
    tiles: TileConfig | None = None,
    out: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention of ``query`` [T, H, D] (one token per request); returns [T, H, D].

    ``workspace`` None: one program per (token, KV head), no merge.
    ``sinks``: ``[H]`` float32 sink logits (gpt-oss), or None.
    """
    if query.stride(-1) != 1:
        query = query.contiguous()
    num_tokens, num_heads, head_size = query.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    group = num_heads // num_kv_heads
    num_splits = 1 if workspace is None else workspace.num_splits
    if tiles is None:
        tiles = default_decode_tiles(workspace is not None, kv_cache.element_size() == 1)
    if workspace is not None and tuple(workspace.acc.shape) != SplitWorkspace.acc_shape(
        num_tokens, num_heads, head_size, num_splits
    ):
        raise ValueError(f"workspace of shape {tuple(workspace.acc.shape)} does not fit query {tuple(query.shape)}")
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    head_pad = max(16, next_power_of_2(head_size))
    partials = (out, out, out) if workspace is None else (workspace.acc, workspace.max, workspace.sum)
    pdl = pdl_enabled(query.device, num_tokens)
    _split_kv_kernel[(num_tokens, num_kv_heads, num_splits)](
        out, *partials, query, key_cache, value_cache,
        batch.seq_lens, batch.block_table, query if sinks is None else sinks,
        batch.num_reqs, params.qk_scale, params.v_scale, params.sliding_window or 0, params.soft_cap or 1.0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), batch.block_table.stride(0),
        GROUP=group, ROWS=max(16, next_power_of_2(group)),
        HEAD_SIZE=head_size, HEAD_PAD=head_pad, BLOCK_SIZE=block_size, BLOCK_N=tiles.block_n,
        NUM_SPLITS=num_splits, USE_WINDOW=params.sliding_window is not None,
        USE_SOFT_CAP=params.soft_cap is not None,
        DOT_DTYPE=cache_dot_dtype(query.dtype, kv_cache.dtype), PRECISION=dot_precision(query.dtype),
        PDL=pdl, USE_SINKS=sinks is not None, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        launch_pdl=pdl,
    )
    if num_splits > 1:  # one split wrote the output itself
        _merge_splits_kernel[(num_tokens, num_heads)](
            out, workspace.acc, workspace.max, workspace.sum, params.v_scale, out.stride(0), out.stride(1),
            HEAD_SIZE=head_size, HEAD_PAD=head_pad, NUM_SPLITS=num_splits, PDL=pdl, num_warps=4, launch_pdl=pdl,
        )
    return out
