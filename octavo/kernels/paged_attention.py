"""Paged attention for mixed batches: one launch for decode rows, prefill
rows, chunked prefill and prefix-cache hits alike.

Work split: program ``(tile, kv_head)`` takes up to ``BLOCK_Q`` consecutive
query tokens of one request and all ``num_heads // num_kv_heads`` query heads
that share ``kv_head``, so each key/value tile it loads serves the whole GQA
group. Rows of the query tile are (token, head-in-group) pairs. Tiles never
straddle requests; a request of ``n`` tokens starting at flat token ``s``
gets at most ``n // BLOCK_Q + 1`` tiles, so ``num_tokens // BLOCK_Q +
num_reqs + 1`` programs cover any batch of ``num_tokens`` tokens. The grid
therefore depends only on the number of tokens and requests (never on
context lengths), which CUDA-graph replay needs; each program finds its
request by binary search over ``query_start_loc``. Programs take the tiles
in reverse (the last request's last tile first): under causal masking the
later tiles of a prompt carry the most keys, and starting them first leaves
short ones for the tail of the launch.

The cache may be fp8 (keys and values widened in registers, to float16
products: ``cache_dot_dtype``; scaled back by
``AttentionParams.k_scale`` / ``v_scale``). Each query token at position ``p`` attends to cached keys ``[0, p]``
(``(p - window, p]`` with a sliding window; scores soft-capped when
``soft_cap`` is set); position ``p`` of the ``j``-th
of a request's ``q_len`` tokens is ``seq_len - q_len + j``. Math: online
softmax in float32, products in the input dtype (float32 in full precision).

Reference: ``octavo.kernels.reference.paged_attention_reference``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.kernels.attention_common import LOG2_E, attend_keys, find_request
from octavo.kernels.triton_utils import cache_dot_dtype, dot_dtype, dot_precision, next_power_of_2


@dataclass(frozen=True)
class PagedBatch:
    """Where each request's queries and cached context are (device tensors)."""

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32
    num_reqs: int


@dataclass(frozen=True)
class AttentionParams:
    scale: float
    sliding_window: int | None = None
    soft_cap: float | None = None  # scores -> soft_cap * tanh(scores / soft_cap)
    # An fp8 cache's per-layer scales: keys are read as ``k * k_scale`` (folded
    # into the softmax scale), values as ``v * v_scale`` (on the output).
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def qk_scale(self) -> float:
        """The kernels' score multiplier (k_scale folded in): base 2 folded in too, unless soft-capping does it later."""
        scale = self.scale * self.k_scale
        return scale if self.soft_cap is not None else scale * LOG2_E


@dataclass(frozen=True)
class TileConfig:
    """Query rows per program (tokens x padded group), keys per step, launch shape."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Decode rows have one token: the smallest tile tl.dot takes. Prefill tiles:
# 64 rows (16 tokens x a GQA group of 4) by 64 keys, 4 warps, was the best of
# 36 shapes on the H200 for 512- and 2048-token prompts (17-21% faster than
# FlashAttention-2's usual 128 x 64 with 8 warps; benchmarks/RESULTS.md);
# heads over 128 take half the keys to stay within registers and shared memory.
DECODE_TILES = TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=2)
PREFILL_TILES = TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=2)
LARGE_HEAD_PREFILL_TILES = TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)


def tiles_for(max_query_len: int, head_size: int) -> TileConfig:
    """Tile shape for a batch whose longest query has ``max_query_len`` tokens."""
    if max_query_len <= 1:
        return DECODE_TILES
    return PREFILL_TILES if head_size <= 128 else LARGE_HEAD_PREFILL_TILES


@triton.jit
def _attend_span(
    q, q_pos, m_i, l_i, acc, lo, end, lo_full, hi_full, sliding_window, qk_scale, soft_cap,
    k_ptr, v_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, token_base,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFT_CAP: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    FRESH: tl.constexpr,
):
    """Keys ``[lo, end)`` of one source (cache, or the step's own K/V with
    ``FRESH``). Keys in ``[lo_full, hi_full)`` are allowed for every row:
    whole tiles of those skip masking; the window's head and the tail are masked."""
    unmasked_lo = lo + tl.cdiv(tl.maximum(lo_full - lo, 0), BLOCK_N) * BLOCK_N
    unmasked_hi = unmasked_lo + tl.maximum(tl.minimum(hi_full, end) - unmasked_lo, 0) // BLOCK_N * BLOCK_N
    if USE_WINDOW:
        m_i, l_i, acc = attend_keys(
            q, q_pos, m_i, l_i, acc, lo, tl.minimum(unmasked_lo, end), end, sliding_window, qk_scale, soft_cap,
            k_ptr, v_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, token_base,
            HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_N, True, USE_WINDOW, USE_SOFT_CAP, DOT_DTYPE, PRECISION, FRESH,
        )
    m_i, l_i, acc = attend_keys(
        q, q_pos, m_i, l_i, acc, unmasked_lo, unmasked_hi, end, sliding_window, qk_scale, soft_cap,
        k_ptr, v_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, token_base,
        HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_N, False, USE_WINDOW, USE_SOFT_CAP, DOT_DTYPE, PRECISION, FRESH,
    )
    m_i, l_i, acc = attend_keys(
        q, q_pos, m_i, l_i, acc, unmasked_hi, end, end, sliding_window, qk_scale, soft_cap,
        k_ptr, v_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, token_base,
        HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_N, True, USE_WINDOW, USE_SOFT_CAP, DOT_DTYPE, PRECISION, FRESH,
    )
    return m_i, l_i, acc


# Values that change from step to step are not specialised on (divisibility
# by 16, equality to 1): each new combination would compile another variant
# in the middle of serving (measured: 0.5 s stalls on the H200).
@triton.jit(do_not_specialize=["num_reqs", "num_tokens", "stride_table", "skip_req"])
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, k_new_ptr, v_new_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_table_ptr, sinks_ptr,
    num_reqs, num_tokens, skip_req, qk_scale, v_scale, sliding_window, soft_cap,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_block, stride_slot, stride_head, stride_table, stride_new_t, stride_new_h,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFT_CAP: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    FRESH_KV: tl.constexpr, CACHE_DOT_DTYPE: tl.constexpr, USE_SINKS: tl.constexpr,
):
    # Heaviest first: a causal prompt's last tiles see the most keys, and
    # blocks start in program order, so the light tiles fill the last wave.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    req = find_request(query_start_loc_ptr, num_reqs, tile, BLOCK_Q, True)
    if req == skip_req:  # another kernel computes this request's rows
        return
    is_real = req < num_reqs
    q_start = tl.load(query_start_loc_ptr + req)
    q_end = tl.load(query_start_loc_ptr + req + 1, mask=is_real, other=num_tokens)
    seq_len = tl.load(seq_lens_ptr + req, mask=is_real, other=0)
    q_len = q_end - q_start
    q_off = (tile - (q_start // BLOCK_Q + req)) * BLOCK_Q
    if q_off >= q_len:
        return
    context_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    q_idx = q_off + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (q_idx < q_len) & (rows % GROUP_PAD < GROUP)
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_SIZE
    token = (q_start + q_idx).to(tl.int64)
    q_ptrs = q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q_mask = row_valid[:, None] & dim_valid[None, :]
    # The cache's keys in CACHE_DOT_DTYPE (float16 for an fp8 cache: ``cache_dot_dtype``).
    q = tl.load(q_ptrs, mask=q_mask, other=0.0).to(CACHE_DOT_DTYPE)
    q_pos = context_len + q_idx

    # Keys the tile sees: [kv_start, kv_end), from the first row's window
    # start to the last row's position. Keys in [lo_full, hi_full) are
    # allowed for every row (inside the last row's window, at or before the
    # first row's position).
    kv_end = tl.minimum(context_len + tl.minimum(q_off + BLOCK_Q, q_len), seq_len)
    hi_full = tl.maximum(tl.minimum(context_len + q_off + 1, kv_end), 0)
    kv_start = 0
    lo_full = 0
    if USE_WINDOW:
        kv_start = tl.maximum(context_len + q_off - sliding_window + 1, 0)
        lo_full = tl.maximum(kv_end - sliding_window, kv_start)

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    if USE_SINKS:
        # A head's sink is one more logit (base 2 here) with a zero value:
        # the running max and sum start from it.
        # log2(e) as a literal: a kernel reads no global that is not a constexpr.
        m_i = tl.load(sinks_ptr + head, mask=row_valid, other=float("-inf")).to(tl.float32) * 1.4426950408889634
        l_i = tl.where(row_valid, 1.0, 0.0)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_PAD], tl.float32)
    table_row = block_table_ptr + req.to(tl.int64) * stride_table
    # FRESH_KV: the step's own keys (positions from context_len on) come from
    # its K/V in the activations' dtype rather than back from an fp8 cache:
    # no widening in registers on the prefill's hot loop, no quantisation
    # error on a prompt's attention to itself (vLLM does the same).
    cache_end = kv_end
    if FRESH_KV:
        cache_end = tl.minimum(kv_end, context_len)
    m_i, l_i, acc = _attend_span(
        q, q_pos, m_i, l_i, acc, kv_start, cache_end, lo_full, hi_full, sliding_window, qk_scale, soft_cap,
        k_cache_ptr, v_cache_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, 0,
        HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_N, USE_WINDOW, USE_SOFT_CAP, CACHE_DOT_DTYPE, PRECISION, False,
    )
    if FRESH_KV:
        if CACHE_DOT_DTYPE != DOT_DTYPE:  # the fresh keys are in the activations' dtype: q again, in it
            q = tl.load(q_ptrs, mask=q_mask, other=0.0).to(DOT_DTYPE)
        m_i, l_i, acc = _attend_span(
            q, q_pos, m_i, l_i, acc, tl.maximum(kv_start, context_len), kv_end, lo_full, hi_full, sliding_window,
            qk_scale, soft_cap, k_new_ptr, v_new_ptr, table_row, kv_head, stride_new_t, 0, stride_new_h, dims,
            q_start - context_len,
            HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, BLOCK_N, USE_WINDOW, USE_SOFT_CAP, DOT_DTYPE, PRECISION, True,
        )

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None] * v_scale
    tl.store(
        out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & dim_valid[None, :],
    )


def num_query_tiles(num_tokens: int, num_reqs: int, block_q: int) -> int:
    """Programs along the token axis: enough for any split of the tokens."""
    return num_tokens // block_q + num_reqs + 1


def query_tokens_per_tile(tiles: TileConfig, group_size: int) -> int:
    return max(1, tiles.block_m // next_power_of_2(group_size))


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    batch: PagedBatch,
    params: AttentionParams,
    tiles: TileConfig = PREFILL_TILES,
    out: torch.Tensor | None = None,
    fresh_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    skip_request: int = -1,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ``query`` [T, H, D] over the paged ``kv_cache``; returns [T, H, D].

    ``kv_cache`` is ``[2, num_blocks, block_size, num_kv_heads, head_size]``.
    Rows of tokens past ``query_start_loc[num_reqs]`` come out as zeros.
    ``fresh_kv``: the step's own keys and values ([T, Hkv, D], unscaled: only
    with ``k_scale == v_scale == 1``), read for each request's new tokens
    instead of the cache (which must hold them too, for later steps).
    ``skip_request``: that request's rows are left unwritten (another kernel
    computes them). ``sinks``: ``[H]`` float32 logits that join each row's
    softmax denominator with no value (gpt-oss), or None.
    """
    if query.stride(-1) != 1:
        query = query.contiguous()
    num_tokens, num_heads, head_size = query.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    key_cache, value_cache = kv_cache[0], kv_cache[1]
    new_key, new_value = _fresh_operands(fresh_kv, params, key_cache)
    block_q = query_tokens_per_tile(tiles, group)
    grid = (num_query_tiles(num_tokens, batch.num_reqs, block_q), num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, key_cache, value_cache, new_key, new_value,
        batch.query_start_loc, batch.seq_lens, batch.block_table, query if sinks is None else sinks,
        batch.num_reqs, num_tokens, skip_request, params.qk_scale, params.v_scale, params.sliding_window or 0, params.soft_cap or 1.0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), batch.block_table.stride(0),
        new_key.stride(0), new_key.stride(1),
        GROUP=group, GROUP_PAD=next_power_of_2(group), HEAD_SIZE=head_size,
        HEAD_PAD=max(16, next_power_of_2(head_size)), BLOCK_SIZE=block_size, BLOCK_Q=block_q,
        BLOCK_N=tiles.block_n, USE_WINDOW=params.sliding_window is not None,
        USE_SOFT_CAP=params.soft_cap is not None, DOT_DTYPE=dot_dtype(query.dtype), PRECISION=dot_precision(query.dtype),
        FRESH_KV=fresh_kv is not None, CACHE_DOT_DTYPE=cache_dot_dtype(query.dtype, kv_cache.dtype),
        USE_SINKS=sinks is not None, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return out


def _fresh_operands(fresh_kv, params: AttentionParams, key_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fresh key and value tensors, sharing strides (the kernel takes one
    pair); without ``fresh_kv``, the cache halves as unused placeholders."""
    if fresh_kv is None:
        return key_cache, key_cache
    if (params.k_scale, params.v_scale) != (1.0, 1.0):
        raise ValueError("fresh_kv holds unscaled keys and values: only for a cache without KV scales")
    key, value = fresh_kv
    if key.stride() != value.stride() or key.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    return key, value
