"""Casting float32 values to fp8 inside kernels, the same on the GPU and in
Triton's interpreter.

On the GPU ``x.to(tl.float8e4nv)`` rounds to nearest even (and saturates,
``cvt.rn.satfinite``). Triton's interpreter (3.9) does not: a mantissa that
rounds up past its binade loses the carry (124.3 -> 64 instead of 128),
subnormals flush to zero and out-of-range values wrap. Under the
interpreter (``PRE_ROUND``) ``cast_to`` therefore first rounds the value to
the fp8 grid itself, saturated, so that the cast that follows is exact; on
the GPU it is the plain cast. Any other dtype is cast directly.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.kernels.triton_utils import interpreting

ROUND_MAGIC = 12582912.0  # 1.5 * 2**23: adding and subtracting it rounds |y| < 2**22 to an integer, ties to even


def pre_round() -> bool:
    """The ``PRE_ROUND`` flag for ``cast_to``: True under the interpreter."""
    return interpreting()


@triton.jit
def _round_to_grid(x, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, MAX: tl.constexpr):
    x = tl.clamp(x, -MAX, MAX)
    exp = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    # Subnormals share the smallest normal binade's spacing.
    quantum = tl.exp2((tl.maximum(exp, MIN_EXP) - MANTISSA).to(tl.float32))
    return ((x / quantum + 12582912.0) - 12582912.0) * quantum


@triton.jit
def cast_to(x, dtype: tl.constexpr, PRE_ROUND: tl.constexpr):
    """``x`` (float32) as ``dtype``, rounded to nearest even, fp8 saturated."""
    if PRE_ROUND:
        if dtype == tl.float8e4nv:
            x = _round_to_grid(x, 3, -6, 448.0)
        elif dtype == tl.float8e5:
            x = _round_to_grid(x, 2, -14, 57344.0)
    return x.to(dtype)
