"""The order in which a 2-D GEMM grid walks its output tiles (device side).

Program ``pid`` of a 1-D grid over ``cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)``
tiles takes tile ``(pid_m, pid_n)`` in groups of ``GROUP_M`` row tiles:
consecutive programs cover a few row tiles across all column tiles, so
programs that read the same weight columns run close together and find them
in L2. Shared by the quantized GEMMs (fp8 block, grouped int4/int8, GGUF).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)``: the output tile of program ``pid``."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n
