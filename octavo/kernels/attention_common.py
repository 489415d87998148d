"""Device functions shared by the attention kernels.

Invariants the kernels rely on:

- ``query_start_loc`` is non-decreasing and starts at 0; request ``i`` owns
  query tokens ``[query_start_loc[i], query_start_loc[i+1])``, the last ones
  of its ``seq_lens[i]`` tokens of context.
- Tokens at or beyond ``query_start_loc[num_reqs]`` (CUDA-graph padding)
  belong to a "virtual" request ``num_reqs`` with no context; its rows come
  out as zeros, so padded outputs are always finite.
- The online softmax works in base 2 (scores are pre-multiplied by
  ``scale * log2(e)``) and guards rows with no allowed key, whose running
  max stays ``-inf``: such rows end with ``l == 0`` and produce zeros.
- With logit soft-capping (``USE_SOFT_CAP``, Gemma 2) ``qk_scale`` is the
  plain scale; scores become ``cap * tanh(scores / cap)``, then base 2.
- The cache's head dimension is contiguous (stride 1).

Triton device functions cannot take dataclasses, so these take their
arguments one by one (the project's "more than 6 parameters -> a dataclass"
rule does not apply to ``@triton.jit`` code).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2_E = 1.4426950408889634


@triton.jit
def find_request(query_start_loc_ptr, num_reqs, target, BLOCK_Q: tl.constexpr, COUNT_REQUESTS: tl.constexpr):
    """Largest ``i`` in ``[0, num_reqs]`` with ``start(i) <= target``.

    ``start(i) = query_start_loc[i] // BLOCK_Q (+ i if COUNT_REQUESTS)``: with
    ``COUNT_REQUESTS`` it is the first query tile of request ``i`` when every
    request's tiles start on a fresh tile (at most ``len // BLOCK_Q + 1`` each).
    """
    lo = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q
        if COUNT_REQUESTS:
            start += mid
        if start <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def kv_tile_offsets(
    block_table_row_ptr, key_pos, key_valid, kv_head, stride_block, stride_slot, stride_head, dims,
    BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr,
):
    """Element offsets [BLOCK_N, HEAD_PAD] of keys ``key_pos`` in one cache half."""
    if MASKED:
        block_ids = tl.load(block_table_row_ptr + key_pos // BLOCK_SIZE, mask=key_valid, other=0)
    else:
        block_ids = tl.load(block_table_row_ptr + key_pos // BLOCK_SIZE)
    rows = block_ids.to(tl.int64) * stride_block + (key_pos % BLOCK_SIZE) * stride_slot + kv_head * stride_head
    return rows[:, None] + dims[None, :]


@triton.jit
def soft_cap_log2(scores, soft_cap):
    """``cap * tanh(scores / cap) * log2(e)``, tanh from exp2 of a non-positive
    argument (no overflow, no cancellation near 0)."""
    x = scores / soft_cap
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # exp(-2|x|)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t) * (soft_cap * 1.4426950408889634)


@triton.jit
def online_softmax_step(
    q, k, v, allowed, m_i, l_i, acc, qk_scale, soft_cap,
    MASKED: tl.constexpr, USE_SOFT_CAP: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    """Fold one key tile into the running (max, sum, acc) of each query row."""
    scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale
    if USE_SOFT_CAP:
        scores = soft_cap_log2(scores, soft_cap)
    if MASKED:
        scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    # A row with nothing allowed yet keeps max -inf; subtracting 0 instead
    # keeps exp2 at exactly 0 rather than NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def attend_keys(
    q, q_pos, m_i, l_i, acc, kv_lo, kv_hi, kv_end, sliding_window, qk_scale, soft_cap,
    k_cache_ptr, v_cache_ptr, table_row, kv_head, stride_block, stride_slot, stride_head, dims, token_base,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, USE_WINDOW: tl.constexpr, USE_SOFT_CAP: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, FRESH: tl.constexpr,
):
    """Fold key tiles at ``kv_lo, kv_lo + BLOCK_N, ... < kv_hi`` into (m, l, acc).

    ``MASKED``: keys at or past ``kv_end``, after a row's position ``q_pos`` or
    outside its window are left out. Unmasked, the caller guarantees every key
    of every tile is allowed for every row, and the loop does no masking.

    ``FRESH``: the keys are not in the paged cache but in the step's own key
    and value tensors (``k_cache_ptr``/``v_cache_ptr`` point at those, row
    ``token_base + key position``, ``stride_block`` their token stride,
    ``stride_head`` their head stride; ``table_row`` is unused).
    """
    dim_valid = dims < HEAD_SIZE
    for start in range(kv_lo, kv_hi, BLOCK_N):
        key_pos = start + tl.arange(0, BLOCK_N)
        key_valid = key_pos < kv_end
        if FRESH:
            rows = (token_base + key_pos).to(tl.int64) * stride_block + kv_head * stride_head
            offsets = rows[:, None] + dims[None, :]
        else:
            offsets = kv_tile_offsets(
                table_row, key_pos, key_valid, kv_head, stride_block, stride_slot, stride_head, dims, BLOCK_SIZE, MASKED
            )
        if MASKED:
            kv_mask = key_valid[:, None] & dim_valid[None, :]
            k = tl.load(k_cache_ptr + offsets, mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + offsets, mask=kv_mask, other=0.0)
            allowed = key_valid[None, :] & (key_pos[None, :] <= q_pos[:, None])
            if USE_WINDOW:
                allowed &= key_pos[None, :] > q_pos[:, None] - sliding_window
        elif HEAD_PAD == HEAD_SIZE:
            k = tl.load(k_cache_ptr + offsets)
            v = tl.load(v_cache_ptr + offsets)
            allowed = key_valid[None, :]  # unused
        else:
            k = tl.load(k_cache_ptr + offsets, mask=dim_valid[None, :], other=0.0)
            v = tl.load(v_cache_ptr + offsets, mask=dim_valid[None, :], other=0.0)
            allowed = key_valid[None, :]  # unused
        m_i, l_i, acc = online_softmax_step(
            q, k, v, allowed, m_i, l_i, acc, qk_scale, soft_cap, MASKED, USE_SOFT_CAP, DOT_DTYPE, PRECISION
        )
    return m_i, l_i, acc
