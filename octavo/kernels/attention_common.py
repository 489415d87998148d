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
- The cache's head dimension is contiguous (stride 1).
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
    BLOCK_SIZE: tl.constexpr,
):
    """Element offsets [BLOCK_N, HEAD_PAD] of keys ``key_pos`` in one cache half."""
    block_ids = tl.load(block_table_row_ptr + key_pos // BLOCK_SIZE, mask=key_valid, other=0).to(tl.int64)
    rows = block_ids * stride_block + (key_pos % BLOCK_SIZE) * stride_slot + kv_head * stride_head
    return rows[:, None] + dims[None, :]


@triton.jit
def online_softmax_step(
    q, k, v, allowed, m_i, l_i, acc, qk_scale, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr
):
    """Fold one key tile into the running (max, sum, acc) of each query row."""
    scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale
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
